// What the job does when a rank fails.
//
//     mpirun -np 2 dist_failures kill CKPT    rank 1 dies (exit without a word)
//                                             at step 6; rank 0 saves CKPT
//                                             after every step
//     mpirun -np 2 dist_failures error FILE   rank 1 cannot load FILE: one line
//                                             from rank 1, then the job ends
//     mpirun -np 2 dist_failures nan CKPT     rank 1's loss turns NaN at step 3
//     mpirun -np 2 dist_failures shapes CKPT  rank 1's store has a [3,2] where rank
//                                             0's has a [2,3] (the same length)
//     mpirun -np 2 dist_failures steps CKPT   rank 1 trains 3 steps and ends (finalize)
//     mpirun -np 2 dist_failures dtypes CKPT  an all-reduce of stores of the same bytes,
//                                             float32 [8] on rank 0 and float64 [4] on
//                                             the others, that no broadcast compared
//     mpirun -np 2 dist_failures empty CKPT   the same with rank 1's store empty
//     mpirun -np 3 dist_failures lengths CKPT float32 stores of 2^20 values, but 8 on
//                                             rank 1: its small buffer would be gathered
//                                             while the others run the ring
//     mpirun -np 2 dist_failures sum CKPT     rank 1 sums its loss (ag_dist_sum) at step
//                                             3 where the others all-reduce gradients
//     mpirun -np 2 dist_failures sumcount CKPT rank 1 sums 2 values where the others
//                                             sum 1
//     mpirun -np 2 dist_failures early CKPT   ag_dist_abort before ag_dist_init
//     mpirun -np 2 dist_failures again CKPT   ag_dist_finalize twice, then ag_dist_init
//     mpirun -np N dist_failures calls:A,B,.. CKPT   rank r makes the r-th call of the list
//                                             (N of them), on a float32 store of 8 values,
//                                             then ends: bcast (ag_dist_broadcast_params),
//                                             sum (ag_dist_sum of one value), grads
//                                             (ag_dist_allreduce_grads), ring (the same of
//                                             2^20 values: the ring, on 3 ranks) or end
//                                             (ag_dist_finalize)
//     mpirun -np 3 dist_failures served CKPT  rank 1's store differs from rank 0's, under an
//                                             error handler that returns: rank 2 still has
//                                             rank 0's values, and every rank finalizes
//     mpirun -np 2 dist_failures leftring CKPT rank 1 ends at once; rank 0, under an error
//                                             handler that returns, all-reduces 2^20 values
//                                             on the ring, then ends too
//     dist_failures load CKPT                 loads the checkpoint (one process)
//                                             and prints its step
// Training runs for 1000 steps otherwise: a job that does not end on the
// failure would run far longer than the test allows.
#define _POSIX_C_SOURCE 200809L  // nanosleep
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attograd.h"
#include "attograd/dist.h"

enum { B = 8, D = 16 };

typedef struct {
    ag_params *ps;
    ag_linear_layer l1, l2;
    ag_optim *opt;
} net;

// `extra`: a 2-D parameter of this shape besides the layers, or NULL.
static void net_init(net *n, const int *extra) {
    n->ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(5, 1);
    ag_linear_layer_init(&n->l1, n->ps, "l1", D, D, true, &rng);
    ag_linear_layer_init(&n->l2, n->ps, "l2", D, 1, true, &rng);
    if (extra) ag_params_add(n->ps, "extra", 2, extra);
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    n->opt = ag_optim_new(n->ps, &oc);
}

// Rank `rank`'s call of the comma-separated list `calls` (one for each of the `size` ranks),
// then ag_dist_finalize: returns 0, or the job ends on a report.
static int one_call(const char *calls, int rank, int size) {
    char call[16] = "";
    int k = 0;
    for (const char *c = calls; k <= rank && *c; k++) {
        size_t len = strcspn(c, ",");
        if (k == rank) snprintf(call, sizeof call, "%.*s", (int)len, c);
        c += len + (c[len] == ',');
    }
    ag_params *ps = ag_params_new(AG_F32);
    ag_params_add(ps, "w", 1, (int[]){strcmp(call, "ring") ? 8 : 1 << 20});
    double value = rank;
    if (!strcmp(call, "bcast"))
        ag_dist_broadcast_params(ps);
    else if (!strcmp(call, "sum"))
        ag_dist_sum(&value, 1);
    else if (!strcmp(call, "grads") || !strcmp(call, "ring"))
        ag_dist_allreduce_grads(ps, 1.0);
    else if (strcmp(call, "end") != 0)
        ag_dist_abort("calls:%s: no call for rank %d of %d", calls, rank, size);
    ag_params_free(ps);
    ag_dist_finalize();
    return 0;
}

// An error handler that says the message and returns, as a program's own may.
static void say_and_return(const char *message, void *user) {
    (void)user;
    fprintf(stderr, "reported: %s\n", message);
}

// Rank 1's parameter is [4] where rank 0's and rank 2's are [2,2], under a handler that
// returns: rank 2, whose layout agrees, takes rank 0's values (7s over its 0s), and every
// rank reaches ag_dist_finalize. Returns 0, or 1 when rank 2 did not get them.
static int served(int rank) {
    ag_error_handler_set(say_and_return, NULL);
    ag_params *ps = ag_params_new(AG_F32);
    ag_tensor *w = rank == 1 ? ag_params_add(ps, "w", 1, (int[]){4})
                             : ag_params_add(ps, "w", 2, (int[]){2, 2});
    ag_tensor_fill(w, rank == 0 ? 7.0 : 0.0);
    ag_dist_broadcast_params(ps);
    const bool got = ag_tensor_item(w, 3) == 7.0;
    if (rank == 2) printf("rank 2 %s rank 0's values\n", got ? "has" : "lacks");
    ag_params_free(ps);
    ag_dist_finalize();
    return rank == 2 && !got;
}

// Rank 1 ends at once while rank 0, under a handler that returns, all-reduces a store too
// large to gather (the ring): rank 0 reports rank 1's farewell, then ends too. Returns 0.
static int left_ring(int rank) {
    ag_error_handler_set(say_and_return, NULL);
    ag_params *ps = ag_params_new(AG_F32);
    ag_params_add(ps, "w", 1, (int[]){1 << 20});
    if (rank == 0) ag_dist_allreduce_grads(ps, 1.0);
    ag_params_free(ps);
    ag_dist_finalize();
    if (rank == 0) printf("rank 0 has ended\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr,
                "usage: dist_failures kill|error|nan|shapes|steps|dtypes|empty|lengths|sum|sumcount|"
                "early|again|served|leftring|calls:A,B,..|load PATH\n");
        return 2;
    }
    const char *mode = argv[1], *path = argv[2];
    net n;
    ag_err err;
    if (!strcmp(mode, "load")) {
        net_init(&n, NULL);
        ag_safetensors *file = NULL;
        if (ag_checkpoint_load(n.ps, ag_optim_state(n.opt), path, &file, &err) != 0) {
            fprintf(stderr, "dist_failures: %s\n", err.msg);
            return 1;
        }
        printf("loaded %s: step %s\n", path, ag_safetensors_meta(file, "step"));
        ag_safetensors_free(file);
        ag_optim_free(n.opt), ag_params_free(n.ps);
        return 0;
    }
    if (!strcmp(mode, "early")) ag_dist_abort("stopped before ag_dist_init");
    ag_dist_init(&argc, &argv);
    int rank = ag_dist_rank();
    // Returns 0 when the second start fails, as it must: a rank ending in failure has
    // mpirun stop the others, perhaps before they print their line.
    if (!strcmp(mode, "again")) {
        ag_dist_finalize();
        ag_dist_finalize();
        return ag_dist_init(&argc, &argv) == -1 ? 0 : 3;
    }
    if (!strcmp(mode, "served")) return served(rank);
    if (!strcmp(mode, "leftring")) return left_ring(rank);
    if (!strncmp(mode, "calls:", 6)) return one_call(mode + 6, rank, ag_dist_size());
    if (!strcmp(mode, "error") && rank == 1) {
        ag_safetensors *st = ag_safetensors_load(path, &err);
        if (!st) ag_dist_abort("%s", err.msg);
        ag_safetensors_free(st);
    }
    if (!strcmp(mode, "dtypes") || !strcmp(mode, "empty")) {  // ends the job, or returns 0
        const bool empty = !strcmp(mode, "empty");
        ag_params *ps = ag_params_new(rank && !empty ? AG_F64 : AG_F32);
        if (!empty || rank == 0) ag_params_add(ps, "w", 1, (int[]){rank ? 4 : 8});
        ag_dist_allreduce_grads(ps, 1.0);
        ag_params_free(ps);
        ag_dist_finalize();
        return 0;
    }
    if (!strcmp(mode, "lengths")) {  // ends the job, or returns 0
        ag_params *ps = ag_params_new(AG_F32);
        ag_params_add(ps, "w", 1, (int[]){rank == 1 ? 8 : 1 << 20});
        ag_dist_allreduce_grads(ps, 1.0);
        ag_params_free(ps);
        ag_dist_finalize();
        return 0;
    }
    bool shapes = !strcmp(mode, "shapes");
    net_init(&n, shapes ? (rank ? (const int[]){3, 2} : (const int[]){2, 3}) : NULL);
    ag_dist_broadcast_params(n.ps);
    ag_tape *tp = ag_tape_new();
    ag_pcg32 rng = ag_pcg32_make(9, (uint64_t)rank);
    const int steps = !strcmp(mode, "steps") && rank == 1 ? 3 : 1000;
    for (int step = 0; step < steps; step++) {
        if (!strcmp(mode, "kill") && rank == 1 && step == 6) _exit(3);
        ag_tape_reset(tp);
        ag_params_zero_grad(n.ps);
        ag_tensor *x = ag_tensor_uniform(AG_F32, 2, (int[]){B, D}, &rng, -1, 1);
        ag_tensor *y = ag_tensor_uniform(AG_F32, 2, (int[]){B, 1}, &rng, -1, 1);
        if (!strcmp(mode, "nan") && rank == 1 && step == 3) ag_tensor_f32(x)[0] = NAN;
        ag_tensor *h = ag_relu(tp, ag_linear_layer_forward(tp, &n.l1, x));
        ag_tensor *loss = ag_mse(tp, ag_linear_layer_forward(tp, &n.l2, h), y);
        ag_backward(tp, loss);
        double value = ag_tensor_item(loss, 0);
        if (isnan(value)) ag_dist_abort("loss is NaN at step %d", step);
        if (!strcmp(mode, "sum") && rank == 1 && step == 3) {
            ag_dist_sum(&value, 1);
            ag_dist_finalize();  // not reached: the job has ended on the report
            return 0;
        }
        double counts[2] = {value, 1};
        if (!strcmp(mode, "sumcount")) ag_dist_sum(counts, rank == 1 ? 2 : 1);
        ag_dist_allreduce_grads(n.ps, 0.5);
        ag_optim_step(n.opt);
        ag_tensor_free(x), ag_tensor_free(y);
        if (rank == 0) {
            char s[16];
            snprintf(s, sizeof s, "%d", step + 1);
            if (ag_checkpoint_save(n.ps, ag_optim_state(n.opt), path, (const char *[]){"step", s, NULL}, &err))
                ag_dist_abort("%s", err.msg);
        }
        nanosleep(&(struct timespec){0, 20000000}, NULL);  // time for a rank to fail mid-run
    }
    ag_tape_free(tp);
    ag_optim_free(n.opt), ag_params_free(n.ps);
    ag_dist_finalize();
    return 0;
}
