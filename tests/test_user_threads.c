// attograd from several threads of the program's own at once, each with its own tape,
// model, optimizer and data (a test suite checking ops in parallel, a server decoding for
// two clients, two models trained side by side): each thread gets the bits it gets alone,
// and the process's settings (the error handler, the thread count) are left as the program
// set them. ThreadSanitizer runs this file too (.ci/run).
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "testing.h"

// ---- Models trained and decoded on threads, against the same runs alone -----------------

typedef struct {
    uint64_t seed;
    bool data_parallel;
    double loss;
    float *params;  // the store's values after the last step
    size_t n;
    double decoded;  // a checksum of the decoded outputs
} model_run;

typedef struct {
    ag_mha m;
    ag_tensor *x, *y;
} mha_data;

static ag_tensor *slice_loss(ag_tape *tp, int begin, int end, void *user, double *weight) {
    mha_data *d = user;
    ag_tensor *x = ag_slice(tp, d->x, 0, begin, end - begin);
    ag_tensor *y = ag_slice(tp, d->y, 0, begin, end - begin);
    ag_mha_opts o = {.causal = true};
    *weight = end - begin;
    return ag_mse(tp, ag_mha_forward(tp, &d->m, x, x, x, &o, NULL), y);
}

// Eight AdamW steps of a MultiheadAttention layer (plain or data-parallel), then a greedy
// decode of 8 positions against a KV cache.
static void *train_and_decode(void *arg) {
    model_run *r = arg;
    ag_pcg32 rng = ag_pcg32_make(r->seed, 7);
    ag_params *ps = ag_params_new(AG_F32);
    mha_data d;
    ag_mha_config cfg = {.embed_dim = 32, .num_heads = 4};
    CHECK(ag_mha_init(&d.m, ps, "attn", &cfg, &rng));
    ag_optim_config oc = ag_optim_defaults(AG_ADAMW);
    ag_optim *opt = ag_optim_new(ps, &oc);
    d.x = ag_tensor_zeros(AG_F32, 3, (int[]){4, 12, 32});
    d.y = ag_tensor_zeros(AG_F32, 3, (int[]){4, 12, 32});
    ag_tensor_init_normal(d.x, &rng, 0, 1);
    ag_tensor_init_normal(d.y, &rng, 0, 1);
    ag_tape *tp = ag_tape_new();
    ag_data_parallel *dp = r->data_parallel ? ag_data_parallel_new(ps) : NULL;
    for (int step = 0; step < 8; step++) {
        ag_params_zero_grad(ps);
        if (dp) {
            r->loss = ag_data_parallel_step(dp, 4, slice_loss, &d);
        } else {
            ag_tape_reset(tp);
            double w;
            ag_tensor *loss = slice_loss(tp, 0, 4, &d, &w);
            ag_backward(tp, loss);
            r->loss = ag_tensor_item(loss, 0);
        }
        ag_optim_step(opt);
    }
    ag_kv_cache *c = ag_kv_cache_new(&d.m, 2, 8);
    ag_tensor *x = ag_tensor_zeros(AG_F32, 2, (int[]){2, 32});
    ag_tensor *out = ag_tensor_zeros(AG_F32, 2, (int[]){2, 32});
    r->decoded = 0;
    for (int t = 0; t < 8; t++) {
        ag_tensor_init_normal(x, &rng, 0, 1);
        CHECK(ag_mha_forward_cached(&d.m, c, x, out));
        for (size_t i = 0; i < out->numel; i++)
            r->decoded += ag_tensor_item(out, i) * (double)(i + 1);
    }
    r->n = ag_params_buffer_len(ps);
    r->params = malloc(r->n * sizeof(float));
    memcpy(r->params, ag_params_data(ps), r->n * sizeof(float));
    ag_kv_cache_free(c);
    ag_tensor_free(x), ag_tensor_free(out);
    ag_data_parallel_free(dp);
    ag_tape_free(tp);
    ag_tensor_free(d.x), ag_tensor_free(d.y);
    ag_optim_free(opt);
    ag_params_free(ps);
    return NULL;
}

static bool same_run(const model_run *a, const model_run *b) {
    return a->loss == b->loss && a->decoded == b->decoded && a->n == b->n &&
           memcmp(a->params, b->params, a->n * sizeof(float)) == 0;
}

static void test_models_on_threads_match_the_same_runs_alone(void) {
    enum { N = 3 };
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        model_run alone[N], together[N];
        pthread_t th[N];
        for (int i = 0; i < N; i++) {
            alone[i] = (model_run){.seed = 40 + (uint64_t)i, .data_parallel = i == 1};
            together[i] = alone[i];
            train_and_decode(&alone[i]);
        }
        for (int i = 0; i < N; i++)
            CHECK(pthread_create(&th[i], NULL, train_and_decode, &together[i]) == 0);
        for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < N; i++) {
            CHECK(isfinite(alone[i].loss) && same_run(&alone[i], &together[i]));
            free(alone[i].params), free(together[i].params);
        }
        CHECK(ag_threads() == threads);
    }
    ag_threads_set(1);
}

// The count is the process's, and a thread may set it while another computes: that one's
// next jobs take the new count. Every op gives the same bits on 1 and 2 threads (the op
// suite checks it), so a plain training run does too.
static atomic_bool trained;

static void *train_and_say(void *arg) {
    train_and_decode(arg);
    atomic_store(&trained, true);
    return NULL;
}

static void test_thread_count_set_while_another_thread_trains(void) {
    ag_threads_set(1);
    model_run alone = {.seed = 9}, beside = {.seed = 9};
    train_and_decode(&alone);
    atomic_store(&trained, false);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, train_and_say, &beside) == 0);
    for (int i = 0; !atomic_load(&trained); i++) {
        ag_threads_set(1 + i % 2);
        CHECK(ag_threads() >= 1);
        sched_yield();
    }
    pthread_join(th, NULL);
    CHECK(same_run(&alone, &beside));
    free(alone.params), free(beside.params);
    ag_threads_set(1);
}

// ---- ag_op_check on threads ---------------------------------------------------------------

// y = 2 a + b, with hooks that run in every forward and backward: the thread then waits,
// in the middle of its check or step, for what a neighbouring thread does.
static void (*forward_hook)(void), (*backward_hook)(void);

static void twice_forward(ag_node *n) {
    if (forward_hook) forward_hook();
    for (size_t i = 0; i < n->out->numel; i++)
        ag_tensor_set_item(n->out, i,
                           2 * ag_tensor_item(n->in[0], i) + ag_tensor_item(n->in[1], i));
}

static void twice_backward(ag_node *n) {
    if (backward_hook) backward_hook();
    ag_tensor ga = ag_tensor_grad_view(n->in[0]), gb = ag_tensor_grad_view(n->in[1]);
    for (size_t i = 0; i < n->out->numel; i++) {
        const double dy = ag_tensor_grad_item(n->out, i);
        if (n->in[0]->grad)
            ag_tensor_set_item(&ga, i, ag_tensor_grad_item(n->in[0], i) + 2 * dy);
        if (n->in[1]->grad) ag_tensor_set_item(&gb, i, ag_tensor_grad_item(n->in[1], i) + dy);
    }
}

static const ag_op twice_op = {"twice", twice_forward, twice_backward, "da = 2 dy; db = dy"};
static const ag_op *const twice_twins[] = {&twice_op, &twice_op};

static ag_tensor *build_twice(ag_tape *tp, ag_tensor *const in[], const void *args) {
    (void)args;
    if (!ag_tensor_same_shape(in[0], in[1])) {
        ag_error("twice: a and b differ in shape");
        return NULL;
    }
    return ag_op_apply(tp, &twice_op, 2, in, in[0]->ndim, in[0]->shape, NULL, 0);
}

static ag_tensor *build_matmul(ag_tape *tp, ag_tensor *const in[], const void *args) {
    (void)args;
    return ag_matmul(tp, in[0], in[1], false, false);
}

static const ag_op_spec twice_spec = {
    "twice", build_twice, NULL, 2, {{.name = "a", .dims = "... N"}, {.name = "b", .dims = "... N"}},
    ""};
static const ag_op_spec matmul_spec = {"matmul", build_matmul, NULL, 2,
                                       {{.name = "a", .dims = "... M K", .broadcast = true},
                                        {.name = "b", .dims = "... K N", .broadcast = true}},
                                       ""};

typedef struct {
    const ag_op_spec *spec;
    ag_op_check_result r;
} op_check_run;

static void *run_op_check(void *arg) {
    op_check_run *c = arg;
    ag_op_check_opts o = ag_op_check_defaults();
    o.out = NULL;
    o.f64_twins = twice_twins;
    o.n_f64_twins = 1;
    ag_op_check(c->spec, &o, &c->r);
    return NULL;
}

// Each check installed its handler for the whole process and set the process's thread
// count, and put back what it had found: the second check to start put back the first
// one's handler (pointing into a stack frame gone), the first put back the default one
// (its bad-shapes case then aborted the other's), and the count was left at 1 or 2.
static void test_op_checks_on_two_threads_at_once(void) {
    ag_threads_set(3);
    op_check_run runs[4] = {{.spec = &matmul_spec}, {.spec = &twice_spec}, {.spec = &matmul_spec},
                          {.spec = &twice_spec}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, run_op_check, &runs[i]) == 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        CHECK(runs[i].r.failed == 0 && runs[i].r.passed >= 12);
        if (runs[i].r.failed)
            fprintf(stderr, "  %s: %s\n", runs[i].spec->name, runs[i].r.first_failure);
    }
    CHECK(ag_threads() == 3);
    ag_threads_set(1);
}

// A neighbour that, at every forward of the checked op, reports an error (through the
// process's handler, which returns) and allocates a tensor. Neither is the op's: the
// check must neither count the neighbour's allocation against the op nor take its error
// for the op's refusal, and the neighbour's error must reach the handler it installed.
static atomic_int want, served;
static atomic_bool neighbour_stop;
static atomic_int neighbour_handled;

static void count_handled(const char *message, void *user) {
    (void)message, (void)user;
    atomic_fetch_add(&neighbour_handled, 1);
}

static void wait_for_neighbour(void) {
    const int asked = atomic_fetch_add(&want, 1) + 1;
    while (atomic_load(&served) < asked) sched_yield();
}

static void *neighbour(void *arg) {
    (void)arg;
    ag_tensor *a = ag_tensor_zeros(AG_F32, 2, (int[]){4, 8});
    ag_tensor *b = ag_tensor_zeros(AG_F32, 2, (int[]){7, 3});
    ag_tape *tp = ag_tape_new();
    while (!atomic_load(&neighbour_stop)) {
        if (atomic_load(&served) == atomic_load(&want)) {
            sched_yield();
            continue;
        }
        CHECK(ag_matmul(tp, a, b, false, false) == NULL);  // inner dimensions differ
        ag_tensor_free(ag_tensor_zeros(AG_F32, 1, (int[]){16}));
        atomic_fetch_add(&served, 1);
    }
    ag_tape_free(tp);
    ag_tensor_free(a), ag_tensor_free(b);
    return NULL;
}

static void test_op_check_beside_a_thread_that_fails_and_allocates(void) {
    atomic_store(&want, 0), atomic_store(&served, 0), atomic_store(&neighbour_handled, 0);
    atomic_store(&neighbour_stop, false);
    ag_error_handler_set(count_handled, NULL);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, neighbour, NULL) == 0);
    forward_hook = wait_for_neighbour;
    op_check_run c = {.spec = &twice_spec};
    run_op_check(&c);
    forward_hook = NULL;
    atomic_store(&neighbour_stop, true);
    pthread_join(th, NULL);
    ag_error_handler_set(NULL, NULL);
    CHECK(c.r.failed == 0 && c.r.passed == 14);
    if (c.r.failed) fprintf(stderr, "  %s\n", c.r.first_failure);
    CHECK(atomic_load(&served) > 10 && atomic_load(&neighbour_handled) == atomic_load(&served));
}

// The handler is the process's too, and a thread may install one while another fails:
// each error reaches one handler, whole (ThreadSanitizer saw the handler and its user
// pointer read while being written).
static atomic_int handled_by[2];
static void count_by(const char *message, void *user) {
    (void)message;
    atomic_fetch_add(&handled_by[(int)(intptr_t)user], 1);
}

static void *fail_until_stopped(void *arg) {
    atomic_int *failures = arg;
    ag_tensor *a = ag_tensor_zeros(AG_F32, 2, (int[]){4, 8});
    ag_tensor *b = ag_tensor_zeros(AG_F32, 2, (int[]){7, 3});
    ag_tape *tp = ag_tape_new();
    while (!atomic_load(&neighbour_stop)) {
        CHECK(ag_matmul(tp, a, b, false, false) == NULL);
        atomic_fetch_add(failures, 1);
    }
    ag_tape_free(tp);
    ag_tensor_free(a), ag_tensor_free(b);
    return NULL;
}

static void test_handler_set_while_another_thread_fails(void) {
    atomic_store(&handled_by[0], 0), atomic_store(&handled_by[1], 0);
    atomic_store(&neighbour_stop, false);
    ag_error_handler_set(count_by, (void *)(intptr_t)0);
    atomic_int failures = 0;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, fail_until_stopped, &failures) == 0);
    for (int i = 1; atomic_load(&failures) < 1000; i++)
        ag_error_handler_set(count_by, (void *)(intptr_t)(i % 2));
    atomic_store(&neighbour_stop, true);
    pthread_join(th, NULL);
    ag_error_handler_set(NULL, NULL);
    CHECK(atomic_load(&handled_by[0]) + atomic_load(&handled_by[1]) == atomic_load(&failures));
}

// ---- A data-parallel step beside a thread that reports errors ----------------------------

// The step tells a failed backward by the count of errors reported during it: that count
// was the process's, so another thread's error, reported meanwhile, turned the step's
// loss into NaN and left the store's gradients at part of the batch's.
static ag_tensor *loss_through_twice(ag_tape *tp, int begin, int end, void *user,
                                     double *weight) {
    mha_data *d = user;
    ag_tensor *w = d->m.out_proj.weight;
    ag_tensor *y = ag_op_apply(tp, &twice_op, 2, (ag_tensor *const[]){w, w}, w->ndim, w->shape,
                               NULL, 0);
    *weight = end - begin;
    return ag_mean(tp, y);
}

static void test_data_parallel_step_beside_a_thread_that_fails(void) {
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        ag_pcg32 rng = ag_pcg32_make(5, 5);
        ag_params *ps = ag_params_new(AG_F32);
        mha_data d;
        ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2};
        CHECK(ag_mha_init(&d.m, ps, "attn", &cfg, &rng));
        ag_data_parallel *dp = ag_data_parallel_new(ps);
        atomic_store(&want, 0), atomic_store(&served, 0), atomic_store(&neighbour_handled, 0);
        atomic_store(&neighbour_stop, false);
        ag_error_handler_set(count_handled, NULL);
        pthread_t th;
        CHECK(pthread_create(&th, NULL, neighbour, NULL) == 0);
        // The neighbour fails once in each slice's backward.
        backward_hook = wait_for_neighbour;
        ag_params_zero_grad(ps);
        const double loss = ag_data_parallel_step(dp, 2, loss_through_twice, &d);
        backward_hook = NULL;
        atomic_store(&neighbour_stop, true);
        pthread_join(th, NULL);
        ag_error_handler_set(NULL, NULL);
        // mean(3 w): 3 times the mean of out_proj.weight, each slice's the same.
        double mean = 0;
        for (size_t i = 0; i < d.m.out_proj.weight->numel; i++)
            mean += ag_tensor_item(d.m.out_proj.weight, i);
        mean = 3 * mean / (double)d.m.out_proj.weight->numel;
        CHECK_NEAR(loss, mean, 1e-6);
        CHECK(atomic_load(&neighbour_handled) == atomic_load(&served) && atomic_load(&served) >= 1);
        ag_tensor g = ag_tensor_grad_view(d.m.out_proj.weight);
        CHECK_NEAR(ag_tensor_item(&g, 0), 3.0 / (double)d.m.out_proj.weight->numel, 1e-6);
        ag_data_parallel_free(dp);
        ag_params_free(ps);
    }
    ag_threads_set(1);
}

int main(void) {
    RUN(test_models_on_threads_match_the_same_runs_alone);
    RUN(test_thread_count_set_while_another_thread_trains);
    RUN(test_op_checks_on_two_threads_at_once);
    RUN(test_op_check_beside_a_thread_that_fails_and_allocates);
    RUN(test_data_parallel_step_beside_a_thread_that_fails);
    RUN(test_handler_set_while_another_thread_fails);
    return testing_summary();
}
