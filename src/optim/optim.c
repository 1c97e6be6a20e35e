// The optimizer object: configuration checks, state buffers, the step driver
// and the accessors for checkpoints, for any optimizer: what differs between them
// is in their descriptors (optimizer.h), listed in optimizers.c. What a checkpoint
// sees of an optimizer is in optim_state.c.
//
// The optimizer keeps the parameters' element ranges and, on each step, runs
// the update kernel over them in fixed blocks of the flat buffers, split
// across threads. Every element's update is independent, so the result does
// not depend on the thread count. The padding between parameters is skipped
// rather than updated with zeros: arithmetic would not always keep it zero
// (with eps = 0, Adam computes 0 / 0 there).
#include "../core/internal.h"
#include "attograd/optim.h"
#include "../core/parallel.h"
#include "optimizer.h"

#include <math.h>
#include <string.h>

// Elements per unit of parallel work: large enough that a block's loop
// dwarfs the cost of handing it out.
#define BLOCK 16384

struct ag_optim {
    ag_params *ps;
    const agi_optimizer *d;
    ag_optim_config cfg;  // cfg.lr follows ag_optim_set_lr
    // The store as the optimizer was made for it: its buffer length (each state
    // buffer's) and each parameter's shape.
    size_t len;
    int count;
    int (*shape)[AG_MAX_DIMS + 1];  // each parameter's ndim, then its extents
    int n_state;
    const char *state_names[AGI_OPTIM_MAX_BUFFERS];
    void *state[AGI_OPTIM_MAX_BUFFERS];
    int64_t steps;
    bool initialised;  // a step has been taken since the buffers were made (or restored)
    // Per parameter: a step has updated it since the buffers were made. SGD starts a
    // parameter's momentum buffer on the first step that updates it, as PyTorch starts
    // it on the first step where the parameter has a gradient: one frozen then would
    // otherwise start its buffer dampened.
    bool *started;
    // Element ranges [span_begin[i], span_end[i]) holding parameters, in
    // increasing order; adjacent parameters share one range when they are in the
    // same weight-decay group (span_decays[i]). Refreshed at every step.
    int n_spans;
    size_t *span_begin, *span_end;
    ag_state described;   // how checkpoints see it (optim_state.c)
    bool *span_decays;
    bool *span_first;  // no step has updated the range's parameters yet
};

ag_optim_config ag_optim_defaults(ag_optim_kind kind) {
    const agi_optimizer *d = agi_optimizer_of(kind);
    ag_optim_config c = {0};
    if (d) c = d->defaults;
    else ag_error("optim_defaults: unknown optimizer kind %d", (int)kind);
    c.kind = kind;
    return c;
}

static bool valid_lr(const char *fn, double lr) {
    if (lr >= 0 && isfinite(lr)) return true;
    ag_error("%s: lr must be finite and >= 0, got %g", fn, lr);
    return false;
}

bool agi_optim_check_nonnegative(const char *what, double v) {
    if (v >= 0) return true;
    ag_error("optim_new: %s must be >= 0, got %g", what, v);
    return false;
}

bool agi_optim_check_betas(const ag_optim_config *c) {
    if (c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1) return true;
    ag_error("optim_new: betas must lie in [0, 1), got (%g, %g)", c->beta1, c->beta2);
    return false;
}

// The checks torch.optim makes in its constructors, with the same bounds: those
// every optimizer shares here, the rest in its descriptor.
static bool valid_config(const agi_optimizer *d, const ag_optim_config *c) {
    if (!d) {
        ag_error("optim_new: unknown optimizer kind %d", (int)c->kind);
        return false;
    }
    if (isnan(c->lr) && isnan(d->defaults.lr)) {
        ag_error("optim_new: %s has no default learning rate: set cfg.lr", d->title);
        return false;
    }
    return valid_lr("optim_new", c->lr) &&
           agi_optim_check_nonnegative("weight_decay", c->weight_decay) && d->check(c);
}

// The ranges of elements of the parameters that require a gradient. ag_params
// lays parameters out in order of addition, each after the previous one, so the
// ranges come out sorted.
static void find_spans(ag_optim *o) {
    int count = ag_params_count(o->ps);
    size_t es = ag_dtype_size(ag_params_dtype(o->ps));
    const char *base = ag_params_data(o->ps);
    o->n_spans = 0;
    for (int i = 0; i < count; i++) {
        ag_tensor *t = ag_params_at(o->ps, i);
        // A frozen parameter is left alone, state and all, as torch.optim leaves
        // one whose .grad is None: momentum and decay would otherwise move it.
        if (!t->requires_grad) continue;
        size_t begin = (size_t)((const char *)t->data - base) / es, end = begin + t->numel;
        bool decays = !(t->agi_bookkeeping & AGI_NO_DECAY), first = !o->started[i];
        if (o->n_spans && o->span_end[o->n_spans - 1] == begin &&
            o->span_decays[o->n_spans - 1] == decays && o->span_first[o->n_spans - 1] == first) {
            o->span_end[o->n_spans - 1] = end;
        } else {
            o->span_begin[o->n_spans] = begin;
            o->span_end[o->n_spans] = end;
            o->span_decays[o->n_spans] = decays;
            o->span_first[o->n_spans] = first;
            o->n_spans++;
        }
    }
}

ag_optim *ag_optim_new(ag_params *ps, const ag_optim_config *cfg) {
    if (!ps || !cfg) {
        ag_error("optim_new: %s is NULL", ps ? "the configuration" : "the parameter store");
        return NULL;
    }
    const agi_optimizer *d = agi_optimizer_of(cfg->kind);
    if (!valid_config(d, cfg)) return NULL;
    if (ag_params_buffer_len(ps) == 0) {
        ag_error("optim_new: the parameter store is empty");
        return NULL;
    }
    ag_optim *o = agi_calloc(sizeof *o);
    o->ps = ps;
    o->d = d;
    o->cfg = *cfg;
    o->len = ag_params_buffer_len(ps);
    o->count = ag_params_count(ps);
    size_t count = (size_t)o->count;
    o->shape = agi_malloc(count * sizeof *o->shape);
    for (int i = 0; i < o->count; i++) {
        const ag_tensor *t = ag_params_at(ps, i);
        o->shape[i][0] = t->ndim;
        memcpy(o->shape[i] + 1, t->shape, sizeof t->shape);
    }
    o->n_state = d->buffers(cfg, o->state_names);
    size_t bytes = o->len * ag_dtype_size(ag_params_dtype(ps));
    for (int i = 0; i < o->n_state; i++) o->state[i] = agi_calloc(bytes);
    o->span_begin = agi_malloc(count * sizeof *o->span_begin);
    o->span_end = agi_malloc(count * sizeof *o->span_end);
    o->span_decays = agi_malloc(count * sizeof *o->span_decays);
    o->span_first = agi_malloc(count * sizeof *o->span_first);
    o->started = agi_calloc(count * sizeof *o->started);
    find_spans(o);
    agi_optim_state_init(&o->described, o);
    return o;
}

void ag_optim_free(ag_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->n_state; i++) agi_free(o->state[i]);
    agi_free(o->shape);
    agi_free(o->span_begin);
    agi_free(o->span_end);
    agi_free(o->span_decays);
    agi_free(o->span_first);
    agi_free(o->started);
    agi_free(o);
}

// A NULL optimizer is reported by the function given it, which then does nothing and
// returns a neutral value (NAN for the lr, 0 or false, a zeroed config).
static bool have_optim(const ag_optim *o, const char *fn) {
    return agi_given(o, fn, "optimizer");
}

// The store is still the one the optimizer was made for: no parameter added and
// none resized. Pruning (ag_params_resize) repacks the store, after which the
// state buffers no longer line up with the parameters.
// The first parameter resized since (its index), or -1: the store's count unchanged. A
// new shape of as many elements keeps the layout but not what each element of the state
// belongs to ([4,6] to [6,4]).
static int first_resized(const ag_optim *o) {
    for (int i = 0; i < o->count; i++) {
        const ag_tensor *t = ag_params_at(o->ps, i);
        if (t->ndim != o->shape[i][0] || memcmp(t->shape, o->shape[i] + 1, sizeof t->shape))
            return i;
    }
    return -1;
}

bool agi_optim_fits(const ag_optim *o) {
    return ag_params_count(o->ps) == o->count && first_resized(o) < 0;
}

static bool store_unchanged(const ag_optim *o) {
    size_t len = ag_params_buffer_len(o->ps);
    int count = ag_params_count(o->ps);
    if (count != o->count) {
        ag_error("optim_step: the parameter store grew from %zu to %zu elements after "
                 "ag_optim_new (%d parameter%s added); create the optimizer after adding "
                 "every parameter",
                 o->len, len, count - o->count, count - o->count == 1 ? " was" : "s were");
        return false;
    }
    const int i = first_resized(o);
    if (i >= 0) {
        const ag_tensor *t = ag_params_at(o->ps, i);
        char store[96];
        if (len == o->len) snprintf(store, sizeof store, "was repacked (%zu elements)", len);
        else snprintf(store, sizeof store, "%s from %zu to %zu elements",
                      len < o->len ? "shrank" : "grew", o->len, len);
        char was[64];
        const size_t numel = agi_numel(o->shape[i][0], o->shape[i] + 1);
        if (t->numel != numel)
            snprintf(was, sizeof was, "%zu to %zu elements", numel, t->numel);
        else
            snprintf(was, sizeof was, "%s to %s", agi_shape_of(o->shape[i][0], o->shape[i] + 1),
                     agi_shape(t));
        ag_error("optim_step: the parameter store %s after ag_optim_new: '%s' was resized from "
                 "%s (ag_params_resize, as ag_mha_prune_heads does), and the optimizer's state "
                 "no longer fits; make a new optimizer for the store as it is now",
                 store, t->name, was);
        return false;
    }
    return true;
}

typedef struct step_job {
    const ag_optim *o;
    agi_update_fn update;
    const agi_update_args *args;
} step_job;

// Blocks [begin, end) of BLOCK elements: the update on their intersection
// with every parameter's range.
static void run_blocks(size_t begin, size_t end, void *ctx) {
    const step_job *job = ctx;
    const ag_optim *o = job->o;
    agi_update_args a = *job->args;
    size_t lo = begin * BLOCK, hi = end * BLOCK;
    if (hi > o->len) hi = o->len;
    // The first range that ends after lo.
    int s = 0, top = o->n_spans;
    while (s < top) {
        int mid = s + (top - s) / 2;
        if (o->span_end[mid] <= lo) s = mid + 1;
        else top = mid;
    }
    for (; s < o->n_spans && o->span_begin[s] < hi; s++) {
        size_t b = o->span_begin[s] > lo ? o->span_begin[s] : lo;
        size_t e = o->span_end[s] < hi ? o->span_end[s] : hi;
        a.weight_decay = o->span_decays[s] ? job->args->weight_decay : 0;  // the second group's is 0
        a.first = o->span_first[s];
        job->update(&a, b, e);
    }
}

void ag_optim_step(ag_optim *o) {
    if (!have_optim(o, "optim_step") || !store_unchanged(o)) return;
    find_spans(o);  // the decay groups may have changed since the last step
    const agi_optimizer *d = o->d;
    agi_update_args a = {0};
    a.param = ag_params_data(o->ps);
    a.grad = ag_params_grad(o->ps);
    for (int i = 0; i < o->n_state; i++) a.state[i] = o->state[i];
    a.cfg = &o->cfg;
    a.weight_decay = o->cfg.weight_decay;
    o->steps++;
    if (d->prepare) d->prepare(&o->cfg, o->steps, a.scalar);
    step_job job = {o, ag_params_dtype(o->ps) == AG_F64 ? d->update_f64 : d->update_f32, &a};
    const size_t blocks = (o->len + BLOCK - 1) / BLOCK;
    agi_parallel_for(blocks, d->flops_per_element * (double)o->len, run_blocks, &job);
    o->initialised = true;
    for (int i = 0; i < o->count; i++) {
        ag_tensor *p = ag_params_at(o->ps, i);
        if (!p->requires_grad) continue;
        o->started[i] = true;
        agi_tensor_written(p);
    }
}

void ag_optim_set_lr(ag_optim *o, double lr) {
    if (have_optim(o, "optim_set_lr") && valid_lr("optim_set_lr", lr)) o->cfg.lr = lr;
}

double ag_optim_lr(const ag_optim *o) { return have_optim(o, "optim_lr") ? o->cfg.lr : NAN; }
ag_optim_config ag_optim_current_config(const ag_optim *o) {
    return have_optim(o, "optim_current_config") ? o->cfg : (ag_optim_config){0};
}
int64_t ag_optim_step_count(const ag_optim *o) {
    return have_optim(o, "optim_step_count") ? o->steps : 0;
}
int ag_optim_state_count(const ag_optim *o) {
    return have_optim(o, "optim_state_count") ? o->n_state : 0;
}

ag_state *ag_optim_state(ag_optim *o) { return o ? &o->described : NULL; }

ag_params *agi_optim_params(const ag_optim *o, size_t *state_len) {
    *state_len = o->len;
    return o->ps;
}

static bool valid_state_index(const char *fn, const ag_optim *o, int i) {
    if (!have_optim(o, fn)) return false;
    if (i >= 0 && i < o->n_state) return true;
    ag_error("%s: state index %d out of range [0, %d)", fn, i, o->n_state);
    return false;
}

const char *ag_optim_state_name(const ag_optim *o, int i) {
    return valid_state_index("optim_state_name", o, i) ? o->state_names[i] : NULL;
}

void *ag_optim_state_data(const ag_optim *o, int i) {
    return valid_state_index("optim_state_data", o, i) ? o->state[i] : NULL;
}

void ag_optim_set_step_count(ag_optim *o, int64_t steps) {
    if (!have_optim(o, "optim_set_step_count")) return;
    if (steps < 0 || steps > AG_OPTIM_MAX_STEPS) {
        ag_error("optim_set_step_count: steps must be >= 0 and <= 2^53, got %lld",
                 (long long)steps);
        return;
    }
    o->steps = steps;
}

// Whether o (not NULL) has SGD's momentum buffer.
static bool momentum_buffer(const ag_optim *o) {
    return o->d->momentum_starts_on_first_step && o->n_state > 0;
}

bool ag_optim_has_momentum_buffer(const ag_optim *o) {
    return have_optim(o, "optim_has_momentum_buffer") && momentum_buffer(o);
}

bool ag_optim_momentum_initialised(const ag_optim *o) {
    return have_optim(o, "optim_momentum_initialised") && momentum_buffer(o) && o->initialised;
}

void ag_optim_set_momentum_initialised(ag_optim *o, bool initialised) {
    if (!have_optim(o, "optim_set_momentum_initialised")) return;
    if (!momentum_buffer(o)) {
        ag_error("optim_set_momentum_initialised: only SGD with momentum has a momentum buffer "
                 "that starts on the first step; this %s optimizer has none",
                 o->d->title);
        return;
    }
    o->initialised = initialised;
    for (int i = 0; i < o->count; i++) o->started[i] = initialised;
}

bool agi_optim_started(const ag_optim *o, int i) { return o->started[i]; }
void agi_optim_set_started(ag_optim *o, int i, bool started) { o->started[i] = started; }
