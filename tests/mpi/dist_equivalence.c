// Data-parallel training equals one process on the whole batch.
//
//     mpirun -np N dist_equivalence f64|f32 GLOBAL_BATCH STEPS TOL
//
// Trains a small attention model (embeddings, causal MultiheadAttention,
// LayerNorm, a linear head, cross-entropy with ignored positions, Adam) for
// STEPS steps twice over: distributed, each rank on its slice of every global
// batch, and, on every rank, alone on the whole batch (the one-process run).
// Checks that
//   - the distributed loss of every step and the final parameters are within
//     TOL of the one-process run's (relative to max(1, |value|));
//   - every rank ends with the same parameters, bit for bit;
//   - a second distributed run gives the same bits (the reductions' order is
//     fixed).
// Ranks other than 0 start from other initial values, so the run also shows
// that ag_dist_broadcast_params makes them start from rank 0's.
// The number of scored positions differs from sequence to sequence, so each
// rank's loss is weighted by its share of the scored positions.
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attograd.h"
#include "attograd/dist.h"

enum { V = 7, T = 6, E = 8, H = 2 };

typedef struct {
    ag_params *ps;
    ag_embedding_layer tok, pos;
    ag_mha attn;
    ag_layernorm_layer norm;
    ag_linear_layer head;
    ag_optim *opt;
} net;

static void net_init(net *n, ag_dtype dt, uint64_t seed) {
    n->ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(seed, 3);
    // No attention biases: the key bias has a gradient of exactly zero in
    // exact arithmetic, and Adam would blow its rounding noise up to steps
    // of size lr, different in every run.
    ag_mha_config mc = {.embed_dim = E, .num_heads = H, .no_bias = true};
    ag_embedding_layer_init(&n->tok, n->ps, "tok", V, E, &rng);
    ag_embedding_layer_init(&n->pos, n->ps, "pos", T, E, &rng);
    ag_mha_init(&n->attn, n->ps, "attn", &mc, &rng);
    ag_layernorm_layer_init(&n->norm, n->ps, "norm", E);
    ag_linear_layer_init(&n->head, n->ps, "head", E, V, true, &rng);
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    oc.lr = 0.01;
    n->opt = ag_optim_new(n->ps, &oc);
}

static void net_free(net *n) {
    ag_optim_free(n->opt);
    ag_params_free(n->ps);
}

// Step `step`'s global batch: B random sequences; the target at position t
// is the token at t - 1 (attention must look back), about a quarter of them
// ignored (never the first two of a sequence).
static void global_batch(int step, int B, int32_t *ids, int32_t *targets) {
    ag_pcg32 rng = ag_pcg32_make(11, 100 + (uint64_t)step);
    for (int i = 0; i < B * T; i++) ids[i] = (int32_t)ag_pcg32_bounded(&rng, V);
    for (int i = 0; i < B * T; i++) {
        targets[i] = i % T ? ids[i - 1] : ids[i];
        if (i % T > 1 && ag_pcg32_bounded(&rng, 4) == 0) targets[i] = AG_IGNORE_INDEX;
    }
}

// One Adam step on sequences [first, first + count) of the batch; with
// `dist`, the gradient and the loss are the whole global batch's. Returns
// the loss.
static double train_step(net *n, ag_tape *tp, const int32_t *ids, const int32_t *targets,
                         int first, int count, bool dist) {
    ag_tape_reset(tp);
    ag_params_zero_grad(n->ps);
    const int32_t *my_ids = ids + (size_t)first * T, *my_targets = targets + (size_t)first * T;
    int32_t pos[T];
    for (int t = 0; t < T; t++) pos[t] = t;
    ag_tensor *x = ag_add(tp, ag_embedding_layer_forward(tp, &n->tok, my_ids, 2, (int[]){count, T}),
                          ag_embedding_layer_forward(tp, &n->pos, pos, 1, (int[]){T}));
    ag_mha_opts o = {.causal = true};
    x = ag_layernorm_layer_forward(tp, &n->norm, ag_add(tp, x, ag_mha_forward(tp, &n->attn, x, x, x, &o, NULL)));
    ag_tensor *loss = ag_cross_entropy(tp, ag_linear_layer_forward(tp, &n->head, x), my_targets,
                                       (size_t)count * T, AG_IGNORE_INDEX);
    ag_backward(tp, loss);
    double value = ag_tensor_item(loss, 0);
    if (dist) {
        // The global loss is the mean over all scored positions: this rank's
        // mean counts with its share of them.
        double scored = 0;
        for (int i = 0; i < count * T; i++) scored += my_targets[i] != AG_IGNORE_INDEX;
        double sums[2] = {value * scored, scored};
        ag_dist_sum(sums, 2);
        ag_dist_allreduce_grads(n->ps, scored / sums[1]);
        value = sums[0] / sums[1];
    }
    ag_optim_step(n->opt);
    return value;
}

// Trains a fresh model for `steps` steps; fills losses[steps] and returns
// the model (free it with net_free).
static net train(ag_dtype dt, int B, int steps, bool dist, ag_tape *tp, double *losses) {
    int rank = ag_dist_rank();
    net n;
    net_init(&n, dt, dist ? 1 + (uint64_t)rank : 1);
    int first = 0, count = B;
    if (dist) {
        ag_dist_broadcast_params(n.ps);
        ag_dist_slice s = ag_dist_batch_slice(B, rank, ag_dist_size());
        first = s.first, count = s.count;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)B * T), *targets = malloc(sizeof(int32_t) * (size_t)B * T);
    for (int step = 0; step < steps; step++) {
        global_batch(step, B, ids, targets);
        losses[step] = train_step(&n, tp, ids, targets, first, count, dist);
    }
    free(ids);
    free(targets);
    return n;
}

static double param_value(const ag_params *ps, size_t i) {
    return ag_params_dtype(ps) == AG_F64 ? ((const double *)ag_params_data(ps))[i]
                                         : ((const float *)ag_params_data(ps))[i];
}

static double rel_diff(double a, double b) { return fabs(a - b) / fmax(1.0, fabs(b)); }

int main(int argc, char **argv) {
    if (ag_dist_init(&argc, &argv) != 0) return 1;
    if (argc != 5 || (strcmp(argv[1], "f64") && strcmp(argv[1], "f32")))
        ag_dist_abort("usage: dist_equivalence f64|f32 GLOBAL_BATCH STEPS TOL");
    ag_dtype dt = strcmp(argv[1], "f64") ? AG_F32 : AG_F64;
    int B = atoi(argv[2]), steps = atoi(argv[3]);
    double tol = atof(argv[4]);
    int rank = ag_dist_rank(), size = ag_dist_size();
    if (B < 1 || steps < 1 || steps > 1000) ag_dist_abort("bad GLOBAL_BATCH or STEPS");

    ag_tape *tp = ag_tape_new();
    double *ref_loss = calloc((size_t)steps, sizeof(double));
    double *loss = calloc((size_t)steps, sizeof(double));
    double *again_loss = calloc((size_t)steps, sizeof(double));
    net ref = train(dt, B, steps, false, tp, ref_loss);
    net d = train(dt, B, steps, true, tp, loss);
    net again = train(dt, B, steps, true, tp, again_loss);

    int ok = 1;
    double worst_loss = 0, worst_param = 0;
    for (int s = 0; s < steps; s++) worst_loss = fmax(worst_loss, rel_diff(loss[s], ref_loss[s]));
    size_t len = ag_params_buffer_len(d.ps), bytes = len * ag_dtype_size(dt);
    for (size_t i = 0; i < len; i++)
        worst_param = fmax(worst_param, rel_diff(param_value(d.ps, i), param_value(ref.ps, i)));
    if (!(worst_loss <= tol && worst_param <= tol)) {
        fprintf(stderr, "rank %d: distributed run differs from one process: loss by %.3g, "
                "parameters by %.3g (tolerance %g)\n", rank, worst_loss, worst_param, tol);
        ok = 0;
    }
    if (memcmp(loss, again_loss, sizeof(double) * (size_t)steps) ||
        memcmp(ag_params_data(d.ps), ag_params_data(again.ps), bytes)) {
        fprintf(stderr, "rank %d: a second distributed run gave other bits\n", rank);
        ok = 0;
    }
    // Every rank must hold rank 0's parameters exactly.
    void *root = malloc(bytes);
    memcpy(root, ag_params_data(d.ps), bytes);
    MPI_Bcast(root, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (memcmp(root, ag_params_data(d.ps), bytes)) {
        fprintf(stderr, "rank %d: parameters differ from rank 0's\n", rank);
        ok = 0;
    }
    free(root);

    int all_ok = ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    ag_dist_slice s = ag_dist_batch_slice(B, rank, size);
    if (rank == 0)
        printf("%s: %s, %d process%s, global batch %d (rank 0: %d), %d steps: loss %.6f -> %.6f; "
               "worst difference from one process: loss %.2g, parameters %.2g (tolerance %g); "
               "rerun bit-identical: %s\n",
               all_ok ? "ok" : "FAIL", argv[1], size, size > 1 ? "es" : "", B, s.count, steps,
               loss[0], loss[steps - 1], worst_loss, worst_param, tol,
               all_ok ? "yes" : "see above");

    net_free(&ref), net_free(&d), net_free(&again);
    free(ref_loss), free(loss), free(again_loss);
    ag_tape_free(tp);
    ag_dist_finalize();
    return all_ok ? 0 : 1;
}
