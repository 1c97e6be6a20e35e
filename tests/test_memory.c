// Memory: every heap allocation is counted, tape memory is reused, and a
// repeated training step allocates nothing after the first one.
#include "model.h"  // examples/copy_task: the demo's model itself
#include "testing.h"

static void test_heap_tensors_are_counted_and_returned(void) {
    ag_memory_stats before = ag_memory_usage();
    ag_tensor *t = ag_tensor_zeros(AG_F32, 2, (int[]){100, 100});
    ag_memory_stats during = ag_memory_usage();
    CHECK(during.allocations > before.allocations);
    CHECK(during.bytes_live >= before.bytes_live + 100 * 100 * sizeof(float));
    CHECK(((uintptr_t)t->data % 64) == 0);
    ag_tensor_free(t);
    ag_memory_stats after = ag_memory_usage();
    CHECK(after.bytes_live == before.bytes_live);
    CHECK(after.allocations - before.allocations == after.frees - before.frees);
}

static void test_tape_memory_is_64_byte_aligned(void) {
    ag_tape *tp = ag_tape_new();
    for (size_t n = 1; n < 200; n += 37) {
        CHECK(((uintptr_t)ag_tape_alloc(tp, n) % 64) == 0);
        ag_tensor *t = ag_tape_tensor(tp, AG_F64, 1, (int[]){(int)n});
        CHECK(((uintptr_t)t->data % 64) == 0);
        CHECK(ag_tensor_item(t, n - 1) == 0.0);
    }
    ag_tape_free(tp);
}

// One training step of a small model built from the core ops: an affine map
// with a parameter store, a squared loss, backward, clipping and SGD.
typedef struct {
    ag_params *ps;
    ag_tensor *w, *b;
    ag_tensor *x, *target;
} affine_model;

static double train_step(ag_tape *tp, affine_model *m) {
    ag_tape_reset(tp);
    ag_params_zero_grad(m->ps);
    ag_tensor *h = ag_add(tp, ag_mul(tp, m->x, m->w), m->b);      // [B, E]
    ag_tensor *d = ag_add(tp, h, ag_scale(tp, m->target, -1.0));  // residual
    ag_tensor *loss = ag_mean(tp, ag_mul(tp, d, d));
    ag_backward(tp, loss);
    ag_params_clip_grad_norm(m->ps, 1.0);
    float *p = ag_params_data(m->ps);
    const float *g = ag_params_grad(m->ps);
    for (size_t i = 0; i < ag_params_buffer_len(m->ps); i++) p[i] -= 0.1f * g[i];
    return ag_tensor_item(loss, 0);
}

static void test_repeated_training_step_allocates_nothing(void) {
    ag_pcg32 rng = ag_pcg32_make(5, 5);
    affine_model m;
    m.ps = ag_params_new(AG_F32);
    m.w = ag_params_add(m.ps, "w", 1, (int[]){16});
    m.b = ag_params_add(m.ps, "b", 1, (int[]){16});
    ag_tensor_init_uniform(m.w, &rng, -1, 1);
    m.x = ag_tensor_uniform(AG_F32, 2, (int[]){32, 16}, &rng, -1, 1);
    m.target = ag_tensor_uniform(AG_F32, 2, (int[]){32, 16}, &rng, -1, 1);
    ag_tape *tp = ag_tape_new();

    double first = train_step(tp, &m);
    ag_memory_stats before = ag_memory_usage();
    double last = first;
    for (int step = 0; step < 20; step++) last = train_step(tp, &m);
    ag_memory_stats after = ag_memory_usage();
    CHECK(after.allocations == before.allocations);
    CHECK(after.bytes_live == before.bytes_live);
    CHECK(last < first);  // and it does train

    ag_tape_free(tp);
    ag_tensor_free(m.x);
    ag_tensor_free(m.target);
    ag_params_free(m.ps);
}

// The copy-task demo's whole step, on the demo's own model (one layer):
// embeddings, causal MultiheadAttention with dropout, residual, LayerNorm,
// head, cross-entropy, backward, clipping, Adam.
typedef struct {
    model net;
    ag_optim *opt;
    int32_t ids[8 * 12], targets[8 * 12];
} demo_run;

static void demo_step(ag_tape *tp, demo_run *r) {
    ag_tape_reset(tp);
    ag_params_zero_grad(r->net.ps);
    model_input in = {.B = 8, .T = 12, .ids = r->ids, .training = true, .dropout_seed = 3};
    ag_backward(tp, ag_cross_entropy(tp, model_forward(tp, &r->net, &in, NULL), r->targets,
                                     8 * 12, AG_IGNORE_INDEX));
    ag_params_clip_grad_norm(r->net.ps, 1.0);
    ag_optim_step(r->opt);
}

static void test_the_demo_training_step_allocates_nothing_after_the_first(void) {
    demo_run r;
    model_config cfg = {.vocab = 11, .d_model = 16, .heads = 4, .layers = 1, .max_len = 12,
                        .dropout = 0.1};
    CHECK(model_init(&r.net, &cfg, AG_F32, 8));
    ag_optim_config oc = ag_optim_defaults(AG_ADAM);
    r.opt = ag_optim_new(r.net.ps, &oc);
    ag_pcg32 rng = ag_pcg32_make(8, 8);
    for (int i = 0; i < 8 * 12; i++) {
        r.ids[i] = (int32_t)ag_pcg32_bounded(&rng, 11);
        r.targets[i] = i % 12 < 6 ? AG_IGNORE_INDEX : (int32_t)ag_pcg32_bounded(&rng, 11);
    }
    ag_tape *tp = ag_tape_new();
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        demo_step(tp, &r);  // sizes the tape (and starts the workers)
        ag_memory_stats before = ag_memory_usage();
        for (int step = 0; step < 10; step++) demo_step(tp, &r);
        // A program that sets its thread count before every step: the count it already
        // has stops no worker (a restarted one allocated its scratch again).
        for (int step = 0; step < 3; step++) {
            ag_threads_set(threads);
            demo_step(tp, &r);
        }
        ag_memory_stats after = ag_memory_usage();
        CHECK(after.allocations == before.allocations);
        CHECK(after.bytes_live == before.bytes_live);
    }
    ag_threads_set(1);
    ag_tape_free(tp);
    ag_optim_free(r.opt);
    model_free(&r.net);
}

static void test_tape_grows_only_when_a_step_needs_more(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_ones(AG_F64, 1, (int[]){1000});
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 2.0)));
    ag_tape_stats s1 = ag_tape_usage(tp);
    ag_tape_reset(tp);
    CHECK(ag_tape_usage(tp).bytes_used == 0);
    // A step twice as big as any before needs more memory, once.
    ag_tensor *big = ag_tensor_ones(AG_F64, 1, (int[]){300000});
    ag_tensor_set_requires_grad(big, true);
    ag_backward(tp, ag_sum(tp, ag_scale(tp, big, 2.0)));
    ag_tape_stats s2 = ag_tape_usage(tp);
    CHECK(s2.bytes_reserved > s1.bytes_reserved);
    CHECK(s2.bytes_peak >= s2.bytes_used && s2.bytes_used >= 2 * 300000 * sizeof(double));
    ag_memory_stats before = ag_memory_usage();
    for (int i = 0; i < 3; i++) {
        ag_tape_reset(tp);
        ag_backward(tp, ag_sum(tp, ag_scale(tp, big, 2.0)));
    }
    CHECK(ag_memory_usage().allocations == before.allocations);
    CHECK(ag_tape_usage(tp).bytes_reserved == s2.bytes_reserved);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(big);
}

int main(void) {
    RUN(test_heap_tensors_are_counted_and_returned);
    RUN(test_tape_memory_is_64_byte_aligned);
    RUN(test_repeated_training_step_allocates_nothing);
    RUN(test_tape_grows_only_when_a_step_needs_more);
    RUN(test_the_demo_training_step_allocates_nothing_after_the_first);
    return testing_summary();
}
