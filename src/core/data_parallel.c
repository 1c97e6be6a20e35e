// A training step split over threads by the batch (see attograd/data_parallel.h).
//
// Three jobs on the thread pool, one slice per thread: every slice's forward (so that the
// total weight is known), every slice's backward seeded with its weight over the total,
// then the gradient buffers added together element by element. Slice 0's tape adds into
// the store's own gradient buffer; slice k > 0's into a buffer of its own, zeroed first,
// which the last job adds in slice order: g = ((g + g_1) + g_2) + ... for every element,
// however the elements are shared out, so the bits depend on the thread count alone.
#include "attograd/data_parallel.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "internal.h"
#include "parallel.h"

enum { MAX_SLICES = 64 };

// Where a slice's tape puts the gradients of the store's parameters: `grad`, laid out as
// the store's gradient buffer.
typedef struct {
    const ag_params *ps;
    char *grad;
} slice_grads;

struct ag_data_parallel {
    ag_params *ps;
    ag_tape *tapes[MAX_SLICES];  // made when first needed
    void *grads[MAX_SLICES];     // slice k > 0's gradient buffer, `grad_bytes` each
    size_t grad_bytes;
    int slices;  // of the last step
    // A step is running: one called from its own loss function (or from another thread
    // at the same time) would reset the tapes the running one records on.
    atomic_bool running;
};

typedef struct {
    ag_data_parallel *dp;
    int n, slices;
    ag_batch_loss_fn fn;
    void *user;
    slice_grads redirect[MAX_SLICES];  // slice k's parameter gradients go to redirect[k].grad
    ag_tensor *loss[MAX_SLICES];
    double weight[MAX_SLICES];
    double total;
    size_t elems;  // of a gradient buffer
} step_job;

ag_data_parallel *ag_data_parallel_new(ag_params *ps) {
    if (!ps) {
        ag_error("data_parallel_new: needs a parameter store");
        return NULL;
    }
    agi_runtime_init();
    ag_data_parallel *dp = agi_calloc(sizeof *dp);
    dp->ps = ps;
    atomic_init(&dp->running, false);
    return dp;
}

void ag_data_parallel_free(ag_data_parallel *dp) {
    if (!dp) return;
    // From a loss function it would free the tapes the running step records on.
    if (atomic_load(&dp->running)) {
        ag_error("data_parallel_free: a step of this data_parallel runs (called from its loss "
                 "function, or from another thread): not freed; free it after the step returns");
        return;
    }
    for (int k = 0; k < MAX_SLICES; k++) {
        ag_tape_free(dp->tapes[k]);
        agi_free(dp->grads[k]);
    }
    agi_free(dp);
}

ag_tape *ag_data_parallel_tape(const ag_data_parallel *dp, int k) {
    return dp && k >= 0 && k < dp->slices ? dp->tapes[k] : NULL;
}

// The input hook of a slice's tape (agi_tape_set_input_hook). Threads that run backward
// on their own tapes over one model must not add into the same gradient (nor mark the
// same tensors live): each tape records a parameter as a copy of its header in tape
// memory, with the gradient moved to the slice's own buffer. Two uses of one parameter
// give two copies over the same gradient, which backward adds into like any shared
// gradient.
static ag_tensor *slice_input(ag_tape *tp, ag_tensor *t, void *ctx) {
    const slice_grads *s = ctx;
    if (!t->requires_grad || (t->agi_bookkeeping & AGI_TAPE)) return t;
    const char *base = ag_params_grad(s->ps);
    const size_t bytes = ag_params_buffer_len(s->ps) * ag_dtype_size(t->dtype);
    const char *g = t->grad;
    if (!(t->agi_bookkeeping & AGI_PARAM) || !g || g < base || g >= base + bytes) {
        ag_error("data_parallel: %s %s requires grad but is not a parameter of the store "
                 "whose gradients the threads share out; its gradient would be written by "
                 "every thread at once",
                 t->name ? t->name : "a tensor", agi_shape(t));
        return NULL;
    }
    ag_tensor *c = ag_tape_alloc(tp, sizeof *c);
    *c = *t;
    c->grad = s->grad + (g - base);
    c->agi_bookkeeping = AGI_TAPE;
    return c;
}

// Slice k's share of zeroing the buffers of slices 1 .. S - 1 (taken as one range of
// (S - 1) elems elements): every slice zeroes as much, so that the forward job does not
// wait for slice 1 to clear a buffer the size of the model alone. Backward, which writes
// them, starts only once every forward has ended.
static void zero_share(const step_job *j, int k) {
    const size_t elem = ag_dtype_size(ag_params_dtype(j->dp->ps));
    const size_t total = (size_t)(j->slices - 1) * j->elems;
    size_t lo = total / (size_t)j->slices * (size_t)k, hi = lo + total / (size_t)j->slices;
    if (k == j->slices - 1) hi = total;
    while (lo < hi) {
        const size_t b = lo / j->elems, at = lo % j->elems;
        const size_t n = hi - lo < j->elems - at ? hi - lo : j->elems - at;
        memset((char *)j->dp->grads[b + 1] + at * elem, 0, n * elem);
        lo += n;
    }
}

static void forward_slices(size_t begin, size_t end, void *ctx) {
    step_job *j = ctx;
    ag_data_parallel *dp = j->dp;
    for (int k = (int)begin; k < (int)end; k++) {  // slices: an int count
        ag_tape *tp = dp->tapes[k];
        // Fresh, as the loss function is promised: a reset keeps a tape's modes, which
        // the last step's function may have left changed.
        ag_tape_reset(tp);
        ag_tape_set_grad_enabled(tp, true);
        ag_tape_set_autocast(tp, AG_AUTOCAST_OFF);
        zero_share(j, k);
        void *grad = k > 0 ? dp->grads[k] : ag_params_grad(dp->ps);
        j->redirect[k] = (slice_grads){dp->ps, grad};
        agi_tape_set_input_hook(tp, slice_input, &j->redirect[k]);
        const int lo = (int)((long long)j->n * k / j->slices);
        const int hi = (int)((long long)j->n * (k + 1) / j->slices);
        j->weight[k] = NAN;
        j->loss[k] = j->fn(tp, lo, hi, j->user, &j->weight[k]);
        agi_tape_set_input_hook(tp, NULL, NULL);
    }
}

static void backward_slices(size_t begin, size_t end, void *ctx) {
    step_job *j = ctx;
    for (int k = (int)begin; k < (int)end; k++) {
        if (j->weight[k] == 0) continue;  // contributes nothing
        ag_tape *tp = j->dp->tapes[k];
        ag_tensor *loss = j->loss[k];
        ag_tensor *dy = ag_tape_tensor(tp, loss->dtype, 0, NULL);
        ag_tensor_set_item(dy, 0, j->weight[k] / j->total);
        ag_backward_with(tp, loss, dy);
    }
}

#define ADD_SLICES(type)                                                          \
    do {                                                                          \
        type *g = ag_params_grad(j->dp->ps);                                      \
        for (int k = 1; k < j->slices; k++) {                                     \
            const type *gk = j->dp->grads[k];                                     \
            for (size_t e = lo; e < hi; e++) g[e] += gk[e];                       \
        }                                                                         \
    } while (0)

static void add_slices(size_t begin, size_t end, void *ctx) {
    const step_job *j = ctx;
    enum { CHUNK = 4096 };
    const size_t lo = begin * CHUNK;
    const size_t hi = end * CHUNK < j->elems ? end * CHUNK : j->elems;
    if (ag_params_dtype(j->dp->ps) == AG_F32)
        ADD_SLICES(float);
    else
        ADD_SLICES(double);
}

// Runs fn over slices [0, slices) of the job on the pool, or here for one slice.
static void run(int slices, double work, void (*fn)(size_t, size_t, void *), step_job *j) {
    if (slices == 1)
        fn(0, 1, j);
    else
        agi_parallel_for((size_t)slices, work, fn, j);
}

static double run_step(ag_data_parallel *dp, int n, ag_batch_loss_fn fn, void *user) {
    step_job j;
    memset(&j, 0, sizeof j);
    j.dp = dp;
    j.n = n;
    j.fn = fn;
    j.user = user;
    j.slices = ag_threads() < n ? ag_threads() : n;
    if (j.slices > MAX_SLICES) j.slices = MAX_SLICES;
    j.elems = ag_params_buffer_len(dp->ps);
    const size_t bytes = j.elems * ag_dtype_size(ag_params_dtype(dp->ps));
    if (bytes != dp->grad_bytes) {  // the first step, or the store has changed size
        for (int k = 0; k < MAX_SLICES; k++) agi_free(dp->grads[k]), dp->grads[k] = NULL;
        dp->grad_bytes = bytes;
    }
    for (int k = 0; k < j.slices; k++) {
        if (!dp->tapes[k]) dp->tapes[k] = ag_tape_new();
        if (k > 0 && !dp->grads[k]) dp->grads[k] = agi_malloc(bytes ? bytes : 1);
    }
    dp->slices = j.slices;

    // Each slice is a whole forward and backward: always worth a thread.
    const double work = 1e12;
    const unsigned long forward_errors = agi_errors_reported();
    run(j.slices, work, forward_slices, &j);
    j.total = 0;
    for (int k = 0; k < j.slices; k++) {
        const ag_tensor *loss = j.loss[k];
        if (!loss) {  // the function's error was reported, unless it gave none
            if (agi_errors_reported() == forward_errors)
                ag_error("data_parallel_step: the loss function returned NULL for slice %d of "
                         "%d (items %lld to %lld) and reported no error",
                         k, j.slices, (long long)n * k / j.slices,
                         (long long)n * (k + 1) / j.slices);
            return NAN;
        }
        const double w = j.weight[k];
        // Backward runs from the loss on the slice's tape: a loss of another tape (or a
        // parameter itself) would be differentiated by every thread into one gradient.
        const bool grad = loss->requires_grad, here = agi_tape_recorded(dp->tapes[k], loss);
        // A slice of weight 0 (no scored target) contributes nothing: its loss is not
        // differentiated.
        if (loss->numel != 1 || !(w >= 0) || !isfinite(w) || (w > 0 && (!grad || !here))) {
            ag_error("data_parallel_step: slice %d of %d (items %lld to %lld) gave a loss %s%s "
                     "with weight %g; the loss must be a scalar that requires grad, recorded "
                     "on the slice's tape, and the weight finite and >= 0",
                     k, j.slices, (long long)n * k / j.slices,
                     (long long)n * (k + 1) / j.slices, agi_shape(loss),
                     !grad ? " (no grad)" : !here ? " (not recorded on the slice's tape)" : "",
                     w);
            return NAN;
        }
        j.total += w;
    }
    // Finite weights can add up to infinity (two of 1e308), which would make every share
    // 0. Scaled by a power of two, which is exact, they give the shares they stand for.
    if (isinf(j.total)) {
        double most = 0;
        for (int k = 0; k < j.slices; k++) most = fmax(most, j.weight[k]);
        int e;
        (void)frexp(most, &e);
        j.total = 0;
        for (int k = 0; k < j.slices; k++) j.total += j.weight[k] = ldexp(j.weight[k], -e);
    }
    if (!(j.total > 0)) {
        ag_error("data_parallel_step: every slice of the %d items has weight 0; at least one "
                 "must weigh more",
                 n);
        return NAN;
    }
    // A slice's backward that fails (an op without one, say) reports through the handler
    // and, when the handler returns, leaves its slice's gradients out: the step must not
    // then pass for the whole batch's.
    const unsigned long errors = agi_errors_reported();
    run(j.slices, work, backward_slices, &j);
    if (agi_errors_reported() != errors) {
        ag_error("data_parallel_step: an error was reported during the slices' backward "
                 "(above); the store's gradients may hold part of the batch's");
        return NAN;
    }
    if (j.slices > 1) {
        const size_t chunks = (j.elems + 4095) / 4096;
        agi_parallel_for(chunks, (double)j.elems * (j.slices - 1), add_slices, &j);
    }
    double mean = 0;
    for (int k = 0; k < j.slices; k++)
        if (j.weight[k] > 0) mean += j.weight[k] / j.total * ag_tensor_item(j.loss[k], 0);
    return mean;
}

double ag_data_parallel_step(ag_data_parallel *dp, int n, ag_batch_loss_fn fn, void *user) {
    if (!dp || !fn || n < 1) {
        ag_error("data_parallel_step: needs a data_parallel, a loss function and n >= 1 "
                 "items, got n = %d",
                 n);
        return NAN;
    }
    if (atomic_exchange(&dp->running, true)) {
        ag_error("data_parallel_step: called while a step of the same data_parallel runs "
                 "(from its loss function, or from another thread); its tapes are in use");
        return NAN;
    }
    agi_threads_pin(true);
    double loss = run_step(dp, n, fn, user);
    agi_threads_pin(false);
    atomic_store(&dp->running, false);
    return loss;
}
