// The optimizer object: configuration checks, state buffers, the step driver
// and the accessors for checkpoints. The arithmetic lives in sgd.c, adam.c and
// lion.c; what a checkpoint sees of an optimizer, in optim_state.c.
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
#include "update.h"

#include <math.h>

// Elements per unit of parallel work: large enough that a block's loop
// dwarfs the cost of handing it out.
#define BLOCK 16384

struct ag_optim {
    ag_params *ps;
    ag_optim_config cfg;  // cfg.lr follows ag_optim_set_lr
    size_t len;           // ag_params_buffer_len at creation
    int n_state;
    void *state[2];       // momentum_buffer; or exp_avg, exp_avg_sq
    int64_t steps;
    bool momentum_initialised;
    // Element ranges [span_begin[i], span_end[i]) holding parameters, in
    // increasing order; adjacent parameters share one range when they are in the
    // same weight-decay group (span_decays[i]). Refreshed at every step.
    int n_spans;
    size_t *span_begin, *span_end;
    ag_state described;   // how checkpoints see it (optim_state.c)
    bool *span_decays;
};

static const char *const state_names[4][2] = {
    [AG_SGD] = {"momentum_buffer", NULL},
    [AG_ADAM] = {"exp_avg", "exp_avg_sq"},
    [AG_ADAMW] = {"exp_avg", "exp_avg_sq"},
    [AG_LION] = {"exp_avg", NULL},
};

static bool valid_kind(ag_optim_kind kind) {
    return kind == AG_SGD || kind == AG_ADAM || kind == AG_ADAMW || kind == AG_LION;
}

ag_optim_config ag_optim_defaults(ag_optim_kind kind) {
    ag_optim_config c = {0};
    c.kind = kind;
    switch (kind) {
    case AG_SGD:
        c.lr = NAN;  // torch.optim.SGD requires an lr
        break;
    case AG_ADAM:
    case AG_ADAMW:
        c.lr = 1e-3;
        c.beta1 = 0.9;
        c.beta2 = 0.999;
        c.eps = 1e-8;
        c.weight_decay = kind == AG_ADAMW ? 1e-2 : 0.0;
        break;
    case AG_LION:
        // The paper's (and lion-pytorch's) defaults.
        c.lr = 1e-4;
        c.beta1 = 0.9;
        c.beta2 = 0.99;
        break;
    default:
        ag_error("optim_defaults: unknown optimizer kind %d", (int)kind);
    }
    return c;
}

static bool valid_lr(const char *fn, double lr) {
    if (lr >= 0 && isfinite(lr)) return true;
    ag_error("%s: lr must be finite and >= 0, got %g", fn, lr);
    return false;
}

// The checks torch.optim makes in its constructors, with the same bounds.
static bool valid_config(const ag_optim_config *c) {
    if (!valid_kind(c->kind)) {
        ag_error("optim_new: unknown optimizer kind %d", (int)c->kind);
        return false;
    }
    if (c->kind == AG_SGD && isnan(c->lr)) {
        ag_error("optim_new: SGD has no default learning rate: set cfg.lr");
        return false;
    }
    if (!valid_lr("optim_new", c->lr)) return false;
    if (!(c->weight_decay >= 0)) {
        ag_error("optim_new: weight_decay must be >= 0, got %g", c->weight_decay);
        return false;
    }
    if (c->kind == AG_SGD) {
        if (!(c->momentum >= 0)) {
            ag_error("optim_new: momentum must be >= 0, got %g", c->momentum);
            return false;
        }
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0)) {
            ag_error("optim_new: Nesterov momentum needs momentum > 0 and dampening 0, "
                     "got momentum %g, dampening %g", c->momentum, c->dampening);
            return false;
        }
        return true;
    }
    if (c->kind != AG_LION && !(c->eps >= 0)) {
        ag_error("optim_new: eps must be >= 0, got %g", c->eps);
        return false;
    }
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1)) {
        ag_error("optim_new: betas must lie in [0, 1), got (%g, %g)", c->beta1, c->beta2);
        return false;
    }
    return true;
}

// The parameters' ranges of elements. ag_params lays parameters out in order
// of addition, each after the previous one, so the ranges come out sorted.
static void find_spans(ag_optim *o) {
    int count = ag_params_count(o->ps);
    size_t es = ag_dtype_size(ag_params_dtype(o->ps));
    const char *base = ag_params_data(o->ps);
    o->n_spans = 0;
    for (int i = 0; i < count; i++) {
        ag_tensor *t = ag_params_at(o->ps, i);
        size_t begin = (size_t)((const char *)t->data - base) / es, end = begin + t->numel;
        bool decays = !(t->agi_bookkeeping & AGI_NO_DECAY);
        if (o->n_spans && o->span_end[o->n_spans - 1] == begin &&
            o->span_decays[o->n_spans - 1] == decays) {
            o->span_end[o->n_spans - 1] = end;
        } else {
            o->span_begin[o->n_spans] = begin;
            o->span_end[o->n_spans] = end;
            o->span_decays[o->n_spans] = decays;
            o->n_spans++;
        }
    }
}

ag_optim *ag_optim_new(ag_params *ps, const ag_optim_config *cfg) {
    if (!ps || !cfg) {
        ag_error("optim_new: %s is NULL", ps ? "the configuration" : "the parameter store");
        return NULL;
    }
    if (!valid_config(cfg)) return NULL;
    if (ag_params_buffer_len(ps) == 0) {
        ag_error("optim_new: the parameter store is empty");
        return NULL;
    }
    ag_optim *o = agi_calloc(sizeof *o);
    o->ps = ps;
    o->cfg = *cfg;
    o->len = ag_params_buffer_len(ps);
    o->n_state = cfg->kind == AG_SGD ? (cfg->momentum != 0) : cfg->kind == AG_LION ? 1 : 2;
    size_t bytes = o->len * ag_dtype_size(ag_params_dtype(ps));
    for (int i = 0; i < o->n_state; i++) o->state[i] = agi_calloc(bytes);
    size_t count = (size_t)ag_params_count(ps);
    o->span_begin = agi_malloc(count * sizeof *o->span_begin);
    o->span_end = agi_malloc(count * sizeof *o->span_end);
    o->span_decays = agi_malloc(count * sizeof *o->span_decays);
    find_spans(o);
    agi_optim_state_init(&o->described, o);
    return o;
}

void ag_optim_free(ag_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->n_state; i++) agi_free(o->state[i]);
    agi_free(o->span_begin);
    agi_free(o->span_end);
    agi_free(o->span_decays);
    agi_free(o);
}

typedef struct step_job {
    const ag_optim *o;
    agi_update_fn update;
    const agi_update_args *args;
} step_job;

// Blocks [begin, end) of BLOCK elements: the update on their intersection
// with every parameter's range.
static void run_blocks(int begin, int end, void *ctx) {
    const step_job *job = ctx;
    const ag_optim *o = job->o;
    agi_update_args no_decay = *job->args;  // the second group: weight_decay 0
    no_decay.weight_decay = 0;
    size_t lo = (size_t)begin * BLOCK, hi = (size_t)end * BLOCK;
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
        job->update(o->span_decays[s] ? job->args : &no_decay, b, e);
    }
}

void ag_optim_step(ag_optim *o) {
    if (!o) {
        ag_error("optim_step: the optimizer is NULL");
        return;
    }
    size_t len = ag_params_buffer_len(o->ps);
    if (len != o->len) {
        ag_error("optim_step: the parameter store grew from %zu to %zu elements after "
                 "ag_optim_new; create the optimizer after adding every parameter",
                 o->len, len);
        return;
    }
    find_spans(o);  // the decay groups may have changed since the last step
    const ag_optim_config *c = &o->cfg;
    bool f64 = ag_params_dtype(o->ps) == AG_F64;
    agi_update_args a = {0};
    a.param = ag_params_data(o->ps);
    a.grad = ag_params_grad(o->ps);
    a.state[0] = o->state[0];
    a.state[1] = o->state[1];
    a.lr = c->lr;
    a.weight_decay = c->weight_decay;
    o->steps++;
    step_job job = {o, NULL, &a};
    double flops_per_element;
    if (c->kind == AG_SGD) {
        a.momentum = c->momentum;
        a.dampening = c->dampening;
        a.nesterov = c->nesterov;
        a.first = !o->momentum_initialised;
        job.update = f64 ? agi_sgd_update_f64 : agi_sgd_update_f32;
        flops_per_element = 6;
    } else if (c->kind == AG_LION) {
        a.beta1 = c->beta1;
        a.beta2 = c->beta2;
        job.update = f64 ? agi_lion_update_f64 : agi_lion_update_f32;
        flops_per_element = 10;
    } else {
        // As PyTorch, in double: beta ** step with the step as a float.
        double t = (double)o->steps;
        a.beta1 = c->beta1;
        a.beta2 = c->beta2;
        a.eps = c->eps;
        a.step_size = c->lr / (1 - pow(c->beta1, t));
        a.bias_correction2_sqrt = sqrt(1 - pow(c->beta2, t));
        a.decoupled = c->kind == AG_ADAMW;
        job.update = f64 ? agi_adam_update_f64 : agi_adam_update_f32;
        flops_per_element = 20;  // counting the square root and division as several
    }
    int blocks = (int)((o->len + BLOCK - 1) / BLOCK);
    agi_parallel_for(blocks, flops_per_element * (double)o->len, run_blocks, &job);
    if (o->n_state && c->kind == AG_SGD) o->momentum_initialised = true;
}

void ag_optim_set_lr(ag_optim *o, double lr) {
    if (valid_lr("optim_set_lr", lr)) o->cfg.lr = lr;
}

double ag_optim_lr(const ag_optim *o) { return o->cfg.lr; }
ag_optim_config ag_optim_config_get(const ag_optim *o) { return o->cfg; }
// The former name (optim.h), an alias.
ag_optim_config ag_optim_get_config(const ag_optim *o) { return ag_optim_config_get(o); }
int64_t ag_optim_step_count(const ag_optim *o) { return o->steps; }
int ag_optim_state_count(const ag_optim *o) { return o->n_state; }

ag_state *ag_optim_state(ag_optim *o) { return o ? &o->described : NULL; }

ag_params *agi_optim_params(const ag_optim *o, size_t *state_len) {
    *state_len = o->len;
    return o->ps;
}

static bool valid_state_index(const char *fn, const ag_optim *o, int i) {
    if (i >= 0 && i < o->n_state) return true;
    ag_error("%s: state index %d out of range [0, %d)", fn, i, o->n_state);
    return false;
}

const char *ag_optim_state_name(const ag_optim *o, int i) {
    return valid_state_index("optim_state_name", o, i) ? state_names[o->cfg.kind][i] : NULL;
}

void *ag_optim_state_data(const ag_optim *o, int i) {
    return valid_state_index("optim_state_data", o, i) ? o->state[i] : NULL;
}

void ag_optim_set_step_count(ag_optim *o, int64_t steps) {
    if (steps < 0 || steps > AG_OPTIM_MAX_STEPS) {
        ag_error("optim_set_step_count: steps must be >= 0 and <= 2^53, got %lld",
                 (long long)steps);
        return;
    }
    o->steps = steps;
}

bool ag_optim_has_momentum_buffer(const ag_optim *o) {
    return o->cfg.kind == AG_SGD && o->n_state == 1;
}

bool ag_optim_momentum_initialised(const ag_optim *o) {
    return ag_optim_has_momentum_buffer(o) && o->momentum_initialised;
}

void ag_optim_set_momentum_initialised(ag_optim *o, bool initialised) {
    if (!ag_optim_has_momentum_buffer(o)) {
        ag_error("optim_set_momentum_initialised: only SGD with momentum has a momentum buffer");
        return;
    }
    o->momentum_initialised = initialised;
}
