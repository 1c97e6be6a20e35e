// The tape: eager ops append nodes; backward walks them in reverse.
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "internal.h"
#include "parallel.h"

struct ag_tape {
    agi_arena arena;   // op outputs, gradients, nodes, saved values, op params
    ag_node **nodes;   // in execution order = a topological order
    ag_autocast *modes;  // modes[i]: the autocast nodes[i] was recorded under
    int n_nodes, cap_nodes, cap_modes;
    bool grad_enabled;
    bool profiling;
    ag_autocast autocast;
    struct agi_bf16_weights *bf16_weights;  // see agi_tape_set_bf16_weights
    agi_tape_input_fn input_hook;  // see agi_tape_set_input_hook
    void *input_ctx;
    struct header_copy *copies;  // see agi_tape_leaf; in the arena
    struct param_use *params;    // see note_param; in the arena
};

// A parameter a recorded node reads, with its shape then. ag_params_resize (pruning) gives
// a parameter a new shape and new buffers under the same tensor: a backward (or a replay,
// in ag_tape_check and ag_tape_html) of nodes recorded before would read it at its new
// shape against outputs and gradients of the old one (a wrong gradient, or reads past
// them), so those refuse the tape (agi_tape_params_resized).
// A write of its values in place (an optimizer's step, a load) between the forward and the
// backward is refused for the same reason as in PyTorch: the backward would read the new
// values against activations of the old ones. Leaves that require grad are noted too (the
// backward reaches them, so they live until it); a leaf that does not may be gone by then.
typedef struct param_use {
    const ag_tensor *t;
    int ndim, shape[AG_MAX_DIMS];
    uint32_t version;
    struct param_use *next;
} param_use;

static void note_param(ag_tape *tp, const ag_tensor *t) {
    for (const param_use *u = tp->params; u; u = u->next)
        if (u->t == t) return;  // a model reads each parameter a few times: the list is short
    param_use *u = agi_arena_alloc(&tp->arena, sizeof *u);
    u->t = t;
    u->ndim = t->ndim;
    memcpy(u->shape, t->shape, sizeof u->shape);
    u->version = agi_tensor_version(t);
    u->next = tp->params;
    tp->params = u;
}

bool agi_tape_params_resized(const ag_tape *tp, char *why, size_t size) {
    for (const param_use *u = tp->params; u; u = u->next) {
        if (u->ndim == u->t->ndim && !memcmp(u->shape, u->t->shape, sizeof u->shape)) continue;
        snprintf(why, size,
                 "parameter '%s' was resized from %s to %s after this tape recorded it "
                 "(ag_params_resize, as ag_mha_prune_heads does): reset the tape and run the "
                 "forward again",
                 u->t->name ? u->t->name : "?", agi_shape_of(u->ndim, u->shape),
                 agi_shape(u->t));
        return true;
    }
    return false;
}

bool agi_tape_params_changed(const ag_tape *tp, char *why, size_t size) {
    if (agi_tape_params_resized(tp, why, size)) return true;
    for (const param_use *u = tp->params; u; u = u->next) {
        if (u->version == agi_tensor_version(u->t)) continue;
        const char *name = u->t->name;
        snprintf(why, size,
                 "%s %s%s%s%s was written in place after this tape recorded it (by "
                 "ag_optim_step, a load, an init, or ag_tensor_fill, _copy or _set_item): "
                 "run the forward again, or step after backward",
                 u->t->agi_bookkeeping & AGI_PARAM ? "parameter" : "leaf", name ? "'" : "",
                 name ? name : "", name ? "' " : "", agi_shape(u->t));
        return true;
    }
    return false;
}

// A header copy ag_op_apply recorded in place of a frozen tensor, and that tensor.
typedef struct header_copy {
    const ag_tensor *copy, *of;
    struct header_copy *next;
} header_copy;

// A header of t in tape memory without its gradient buffer: what a node reads of a frozen
// tensor that holds one (ag_op_apply, backward_node), so that no backward writes there.
static ag_tensor *gradless_copy(ag_tape *tp, const ag_tensor *t) {
    ag_tensor *c = agi_arena_alloc(&tp->arena, sizeof *c);
    *c = *t;
    c->grad = NULL;
    c->agi_bookkeeping = AGI_TAPE;
    return c;
}

const ag_tensor *agi_tape_leaf(const ag_tape *tp, const ag_tensor *t) {
    if (!(t->agi_bookkeeping & AGI_TAPE)) return t;  // not made by a tape
    for (const header_copy *h = tp->copies; h; h = h->next)
        if (h->copy == t) return h->of;
    return t;
}

// The handle functions report a NULL tape (a handler that returns then gets a neutral
// result) instead of dereferencing it; ag_tape_free(NULL) does nothing, as free does.
static bool have_tape(const ag_tape *tp, const char *fn) { return agi_given(tp, fn, "tape"); }

void ag_tape_set_profiling(ag_tape *tp, bool on) {
    if (have_tape(tp, "tape_set_profiling")) tp->profiling = on;
}

ag_tape *ag_tape_new(void) {
    agi_runtime_init();
    ag_tape *tp = agi_calloc(sizeof *tp);
    agi_arena_init(&tp->arena);
    tp->grad_enabled = true;
    return tp;
}

void ag_tape_free(ag_tape *tp) {
    if (!tp) return;
    agi_arena_free(&tp->arena);
    agi_free(tp->nodes);
    agi_free(tp->modes);
    agi_free(tp);
}

void ag_tape_reset(ag_tape *tp) {
    if (!have_tape(tp, "tape_reset")) return;
    agi_arena_reset(&tp->arena);
    tp->n_nodes = 0;
    tp->copies = NULL;
    tp->params = NULL;
}

bool ag_tape_set_grad_enabled(ag_tape *tp, bool enabled) {
    if (!have_tape(tp, "tape_set_grad_enabled")) return false;
    bool old = tp->grad_enabled;
    tp->grad_enabled = enabled;
    return old;
}

bool ag_tape_grad_enabled(const ag_tape *tp) {
    return have_tape(tp, "tape_grad_enabled") && tp->grad_enabled;
}

ag_autocast ag_tape_set_autocast(ag_tape *tp, ag_autocast mode) {
    if (!have_tape(tp, "tape_set_autocast")) return AG_AUTOCAST_OFF;
    if (mode != AG_AUTOCAST_OFF && mode != AG_AUTOCAST_BF16) {
        ag_error("tape_set_autocast: mode %d is neither AG_AUTOCAST_OFF (0) nor "
                 "AG_AUTOCAST_BF16 (1); the setting stays %d",
                 (int)mode, (int)tp->autocast);
        return tp->autocast;
    }
    ag_autocast old = tp->autocast;
    tp->autocast = mode;
    return old;
}

ag_autocast ag_tape_autocast(const ag_tape *tp) { return tp ? tp->autocast : AG_AUTOCAST_OFF; }

void agi_tape_set_bf16_weights(ag_tape *tp, struct agi_bf16_weights *t) { tp->bf16_weights = t; }
struct agi_bf16_weights *agi_tape_bf16_weights(const ag_tape *tp) {
    return tp ? tp->bf16_weights : NULL;
}

void *ag_tape_alloc(ag_tape *tp, size_t bytes) {
    if (!agi_given(tp, "tape_alloc", "tape")) return NULL;
    if (bytes > AG_MAX_BYTES) {
        ag_error("tape_alloc: %zu bytes requested, more than the 2^%d one allocation may take",
                 bytes, agi_max_bytes_log2());
        return NULL;
    }
    return agi_arena_alloc(&tp->arena, bytes);
}

static ag_tensor *tape_tensor_uninit(ag_tape *tp, ag_dtype dt, int ndim, const int shape[]) {
    ag_tensor *t = agi_arena_alloc(&tp->arena, sizeof *t);
    agi_tensor_header(t, dt, ndim, shape);
    t->data = agi_arena_alloc(&tp->arena, t->numel * agi_dtype_size(dt));
    t->agi_bookkeeping = AGI_TAPE;
    return t;
}

ag_tensor *ag_tape_tensor(ag_tape *tp, ag_dtype dt, int ndim, const int shape[]) {
    if (!agi_given(tp, "tape_tensor", "tape")) return NULL;
    if (!agi_valid_shape("tape_tensor", dt, ndim, shape)) return NULL;
    ag_tensor *t = tape_tensor_uninit(tp, dt, ndim, shape);
    memset(t->data, 0, t->numel * agi_dtype_size(dt));
    return t;
}

ag_tensor *ag_detach(ag_tape *tp, const ag_tensor *x) {
    if (!agi_given(tp, "detach", "tape") || !agi_given(x, "detach", "tensor")) return NULL;
    ag_tensor *t = agi_arena_alloc(&tp->arena, sizeof *t);
    agi_tensor_header(t, x->dtype, x->ndim, x->shape);
    t->data = x->data;
    t->agi_bookkeeping = AGI_TAPE;
    return t;
}

void agi_ensure_grad(ag_tape *tp, ag_tensor *t) {
    if (t->grad) return;
    size_t bytes = t->numel * agi_dtype_size(t->dtype);
    if (t->agi_bookkeeping & AGI_TAPE) {
        t->grad = agi_arena_alloc(&tp->arena, bytes);
        agi_zero(t->grad, bytes);
    } else {
        // Heap leaves keep their gradient across steps (allocated once).
        // Parameters always have one already, in their store's buffer.
        t->grad = agi_calloc(bytes);
    }
}

void agi_tape_set_input_hook(ag_tape *tp, agi_tape_input_fn fn, void *ctx) {
    tp->input_hook = fn;
    tp->input_ctx = fn ? ctx : NULL;
}

ag_tensor *agi_tape_input(ag_tape *tp, ag_tensor *t) {
    return tp->input_hook && t ? tp->input_hook(tp, t, tp->input_ctx) : t;
}

ag_tensor *agi_rows_view(ag_tape *tp, ag_tensor *t, int start, int count) {
    t = t ? agi_tape_input(tp, t) : NULL;
    if (!t || t->ndim < 1 || start < 0 || count < 1 || start + count > t->shape[0]) {
        ag_error("rows_view: rows [%d, %d) are outside %s", start, start + count, agi_shape(t));
        return NULL;
    }
    int shape[AG_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
    shape[0] = count;
    ag_tensor *v = agi_arena_alloc(&tp->arena, sizeof *v);
    agi_tensor_header(v, t->dtype, t->ndim, shape);
    size_t offset = (size_t)start * (t->numel / (size_t)t->shape[0]) * agi_dtype_size(t->dtype);
    v->data = (char *)t->data + offset;
    if (t->requires_grad) {
        agi_ensure_grad(tp, t);
        v->grad = (char *)t->grad + offset;
        v->requires_grad = true;
    }
    v->name = t->name;
    v->agi_bookkeeping = AGI_TAPE;
    return v;
}

static void push_node(ag_tape *tp, ag_node *n) {
    // Grows during the first step only: the capacity is kept on reset.
    tp->nodes = agi_reserve(tp->nodes, &tp->cap_nodes, tp->n_nodes, tp->n_nodes + 1, 64,
                            sizeof *tp->nodes);
    tp->modes = agi_reserve(tp->modes, &tp->cap_modes, tp->n_nodes, tp->n_nodes + 1, 64,
                            sizeof *tp->modes);
    n->index = tp->n_nodes;
    tp->modes[tp->n_nodes] = tp->autocast;
    tp->nodes[tp->n_nodes++] = n;
}

ag_autocast agi_node_autocast(const ag_node *n) {
    const ag_tape *tp = n ? n->tape : NULL;
    return tp && n->index >= 0 && n->index < tp->n_nodes && tp->nodes[n->index] == n
               ? tp->modes[n->index]
               : AG_AUTOCAST_OFF;
}

ag_tensor *ag_op_apply(ag_tape *tp, const ag_op *op, int n_in, ag_tensor *const in[],
                    int out_ndim, const int out_shape[], const void *params,
                    size_t params_size) {
    const char *name = op && op->name ? op->name : "op_apply";
    if (!agi_given(tp, name, "tape")) return NULL;
    if (!op || !op->forward) {
        ag_error("%s: needs an op with a forward function", name);
        return NULL;
    }
    if (n_in < 0 || n_in > AG_MAX_INPUTS) {
        ag_error("%s: %d inputs given, at most %d are supported", name, n_in, AG_MAX_INPUTS);
        return NULL;
    }
    if (n_in > 0 && !in) {
        ag_error("%s: the input array is NULL (n_in %d)", name, n_in);
        return NULL;
    }
    if (params_size > 0 && !params) {
        ag_error("%s: params is NULL (params_size %zu)", name, params_size);
        return NULL;
    }
    if (params_size > AG_MAX_BYTES) {
        ag_error("%s: params_size %zu is more than the 2^%d bytes one allocation may take", name,
                 params_size, agi_max_bytes_log2());
        return NULL;
    }
    ag_tensor *inputs[AG_MAX_INPUTS];
    const ag_tensor *first_float = NULL;
    bool requires = false;
    for (int i = 0; i < n_in; i++) {
        if (!in[i]) {
            ag_error("%s: input %d is NULL", name, i);
            return NULL;
        }
        if (!in[i]->data) {
            ag_error("%s: input %d %s has no data (a gradient view no backward has reached)",
                     name, i, agi_shape(in[i]));
            return NULL;
        }
        // Backward on tp walks tp's nodes only: an input from another tape's node would
        // take its gradient and pass none of it on, a silently partial gradient.
        if (in[i]->requires_grad && in[i]->node && tp->grad_enabled &&
            !agi_tape_recorded(tp, in[i])) {
            ag_error("%s: input %d %s was recorded on another tape (or on this one before "
                     "ag_tape_reset): its gradient would stop there",
                     name, i, agi_shape(in[i]));
            return NULL;
        }
        // A leaf in another tape's memory (ag_tape_tensor) would get its gradient in this
        // tape's: gone at this tape's reset, while the leaf still points there, so the next
        // step's tensors and its gradient would share memory.
        if (in[i]->requires_grad && !in[i]->node && (in[i]->agi_bookkeeping & AGI_TAPE) &&
            tp->grad_enabled && !agi_arena_owns(&tp->arena, in[i])) {
            ag_error("%s: input %d %s is a leaf made on another tape (ag_tape_tensor): its "
                     "gradient would live in this tape's memory and go with its reset; make "
                     "it on this tape, or on the heap",
                     name, i, agi_shape(in[i]));
            return NULL;
        }
        int seen = 0;  // an input given twice is recorded as the same tensor twice
        while (seen < i && in[seen] != in[i]) seen++;
        inputs[i] = seen < i ? inputs[seen] : agi_tape_input(tp, in[i]);
        if (!inputs[i]) return NULL;
        if (!agi_is_float(in[i]->dtype)) continue;
        if (!first_float) {
            first_float = in[i];
        } else if (in[i]->dtype != first_float->dtype) {
            ag_error("%s: inputs mix dtypes: %s %s and %s %s", name,
                     ag_dtype_name(first_float->dtype), agi_shape(first_float),
                     ag_dtype_name(in[i]->dtype), agi_shape(in[i]));
            return NULL;
        }
        requires = requires || in[i]->requires_grad;
    }
    if (!first_float) {
        ag_error("%s: needs at least one f32 or f64 input", name);
        return NULL;
    }
    if (!agi_valid_shape(name, first_float->dtype, out_ndim, out_shape)) return NULL;

    bool record = requires && tp->grad_enabled;
    for (int i = 0; record && i < n_in; i++)
        if ((in[i]->agi_bookkeeping & AGI_PARAM) || (in[i]->requires_grad && !in[i]->node))
            note_param(tp, in[i]);
    // A tensor that does not require grad may still hold a gradient buffer (a frozen
    // parameter, a leaf frozen after a backward): every backward writes where grad is
    // non-NULL, so the node records a header copy without it. Copied, not cleared, since
    // the tensor may be shared by tapes recording on other threads.
    for (int i = 0; record && i < n_in; i++) {
        ag_tensor *t = inputs[i];
        if (t->requires_grad || !t->grad) continue;
        ag_tensor *c = gradless_copy(tp, t);
        for (int k = i; k < n_in; k++)
            if (inputs[k] == t) inputs[k] = c;
        header_copy *h = agi_arena_alloc(&tp->arena, sizeof *h);
        *h = (header_copy){c, t, tp->copies};
        tp->copies = h;
    }
    ag_node local, *n = record ? agi_arena_alloc(&tp->arena, sizeof *n) : &local;
    // Field by field, not memset and a copy of n_in inputs: on AMD's cores those two became
    // rep stos and rep movs, whose start-up took a third of this function in a decode step.
    n->op = op;
    n->tape = tp;
    n->out = NULL;
    n->n_in = n_in;
    for (int i = 0; i < AG_MAX_INPUTS; i++) n->in[i] = i < n_in ? inputs[i] : NULL;
    n->params = NULL;
    n->saved = NULL;
    n->index = 0;
    n->forward_seconds = n->backward_seconds = 0;
    if (params_size) {
        n->params = agi_arena_alloc(&tp->arena, params_size);
        memcpy(n->params, params, params_size);
    }
    n->recording = record;
    n->out = tape_tensor_uninit(tp, first_float->dtype, out_ndim, out_shape);
    double start = tp->profiling ? agi_seconds_now() : 0;
    op->forward(n);
    if (tp->profiling) n->forward_seconds = agi_seconds_now() - start;
    if (record) {
        n->out->requires_grad = true;
        n->out->node = n;
        push_node(tp, n);
    }
    return n->out;
}

// y.grad += dy (or += 1 for a scalar loss when dy is NULL).
static void seed_gradient(ag_tensor *y, const ag_tensor *dy) {
    if (!dy) {
        if (y->dtype == AG_F32)
            ((float *)y->grad)[0] += 1.0f;
        else
            ((double *)y->grad)[0] += 1.0;
    } else if (y->dtype == AG_F32 && dy->dtype == AG_F32) {
        float *g = y->grad;
        const float *d = dy->data;
        for (size_t i = 0; i < y->numel; i++) g[i] += d[i];
    } else if (y->dtype == AG_F64 && dy->dtype == AG_F64) {
        double *g = y->grad;
        const double *d = dy->data;
        for (size_t i = 0; i < y->numel; i++) g[i] += d[i];
    } else {  // mixed dtypes: convert element by element
        ag_tensor view = ag_tensor_grad_view(y);
        for (size_t i = 0; i < y->numel; i++)
            ag_tensor_set_item(&view, i, ag_tensor_item(&view, i) + ag_tensor_item(dy, i));
    }
}

// Marks every tensor that y's gradient reaches (AGI_GRAD_LIVE), from node `last` (y's)
// down. Returns false, after reporting, when one of the nodes it reaches has no backward:
// then no gradient has moved.
static bool mark_reached(ag_tape *tp, ag_tensor *y, int last) {
    y->agi_bookkeeping |= AGI_GRAD_LIVE;
    for (int i = last; i >= 0; i--) {
        ag_node *n = tp->nodes[i];
        if (!(n->out->agi_bookkeeping & AGI_GRAD_LIVE)) continue;  // not an ancestor of y
        if (!n->op->backward) {
            ag_error("backward: op %s (node %d) has no backward function",
                     n->op->name ? n->op->name : "?", i);
            return false;
        }
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->requires_grad) n->in[k]->agi_bookkeeping |= AGI_GRAD_LIVE;
    }
    return true;
}

// Runs one node's backward, its inputs' gradients made first. An input frozen since it
// was recorded (ag_tensor_set_requires_grad(p, false) between forward and backward) still
// holds its gradient buffer, where the op's backward would write: for this call it is
// replaced by a header copy without one, as ag_op_apply records a tensor frozen before,
// and as PyTorch's AccumulateGrad skips a leaf that no longer requires grad.
static void backward_node(ag_tape *tp, ag_node *n) {
    ag_tensor *recorded[AG_MAX_INPUTS];
    bool swapped = false;
    for (int k = 0; k < n->n_in; k++) {
        ag_tensor *t = recorded[k] = n->in[k];
        if (t->requires_grad) {
            agi_ensure_grad(tp, t);
            continue;
        }
        if (!t->grad) continue;
        int j = 0;  // a tensor given twice shares one copy
        while (j < k && recorded[j] != t) j++;
        n->in[k] = j == k ? gradless_copy(tp, t) : n->in[j];
        swapped = true;
    }
    double start = tp->profiling ? agi_seconds_now() : 0;
    n->op->backward(n);
    if (tp->profiling) n->backward_seconds = agi_seconds_now() - start;
    for (int k = 0; swapped && k < n->n_in; k++) n->in[k] = recorded[k];
}

bool agi_tape_recorded(const ag_tape *tp, const ag_tensor *y) {
    const ag_node *n = y->node;
    return n && n->tape == tp && n->index >= 0 && n->index < tp->n_nodes &&
           tp->nodes[n->index] == n;
}

static void run_backward(ag_tape *tp, ag_tensor *y, const ag_tensor *dy) {
    if (!have_tape(tp, "backward")) return;
    if (!y || !y->requires_grad) {
        ag_error("backward: the output %s does not require grad (no input requires "
                 "grad, or it was computed in no-grad mode)",
                 agi_shape(y));
        return;
    }
    if (y->node && !agi_tape_recorded(tp, y)) {
        ag_error("backward: the output %s was not recorded on this tape", agi_shape(y));
        return;
    }
    char why[256];
    if (agi_tape_params_changed(tp, why, sizeof why)) {
        ag_error("backward: %s", why);
        return;
    }
    // Intermediate gradients start from zero on every backward; leaf
    // gradients keep accumulating until the user zeroes them. An upstream gradient that is
    // the view of one of them (the gradient an earlier backward left there) is read first.
    ag_tensor dy_copy;
    for (int i = 0; dy && i < tp->n_nodes; i++) {
        if (tp->nodes[i]->out->grad != dy->data) continue;
        size_t bytes = dy->numel * agi_dtype_size(dy->dtype);
        dy_copy = *dy;
        dy_copy.data = agi_arena_alloc(&tp->arena, bytes);
        memcpy(dy_copy.data, dy->data, bytes);
        dy = &dy_copy;
        break;
    }
    for (int i = 0; i < tp->n_nodes; i++) {
        ag_tensor *o = tp->nodes[i]->out;
        o->agi_bookkeeping &= ~(uint32_t)AGI_GRAD_LIVE;
        if (o->grad) ag_tensor_zero_grad(o);
    }
    const int last = y->node ? y->node->index : -1;
    if (!mark_reached(tp, y, last)) return;

    agi_ensure_grad(tp, y);
    seed_gradient(y, dy);
    for (int i = last; i >= 0; i--)
        if (tp->nodes[i]->out->agi_bookkeeping & AGI_GRAD_LIVE) backward_node(tp, tp->nodes[i]);
}

void ag_backward(ag_tape *tp, ag_tensor *loss) {
    if (!agi_given(loss, "backward", "loss")) return;  // what a failed op returned
    if (loss->numel != 1) {
        ag_error("backward: loss must be a scalar, got %s (use ag_backward_with to "
                 "pass an upstream gradient)",
                 agi_shape(loss));
        return;
    }
    run_backward(tp, loss, NULL);
}

void ag_backward_with(ag_tape *tp, ag_tensor *y, const ag_tensor *dy) {
    if (!agi_given(y, "backward", "output") || !agi_given(dy, "backward", "upstream gradient"))
        return;
    // A non-float dy has the right shape more often than not: naming its dtype says what
    // is wrong, where "does not match" over two equal shapes said nothing.
    if (!agi_is_float(dy->dtype)) {
        ag_error("backward: upstream gradient %s must be f32 or f64 (output %s)",
                 agi_dtype_shape(dy), agi_dtype_shape(y));
        return;
    }
    if (!ag_tensor_same_shape(y, dy)) {
        ag_error("backward: upstream gradient %s does not match output %s",
                 agi_shape(dy), agi_shape(y));
        return;
    }
    if (!dy->data) {
        ag_error("backward: upstream gradient %s has no data (a gradient view no backward has "
                 "reached)",
                 agi_shape(dy));
        return;
    }
    run_backward(tp, y, dy);
}

int ag_tape_num_nodes(const ag_tape *tp) {
    return have_tape(tp, "tape_num_nodes") ? tp->n_nodes : 0;
}

ag_node *ag_tape_node(const ag_tape *tp, int i) {
    if (!have_tape(tp, "tape_node")) return NULL;
    // An out-of-range index is a programming error (base.h): a silent NULL crashed later.
    if (i < 0 || i >= tp->n_nodes) {
        ag_error("tape_node: index %d is out of range for a tape of %d nodes", i, tp->n_nodes);
        return NULL;
    }
    return tp->nodes[i];
}

ag_tape_stats ag_tape_usage(const ag_tape *tp) {
    ag_tape_stats s = {0, 0, 0, 0};
    if (!have_tape(tp, "tape_usage")) return s;
    s.bytes_used = tp->arena.used;
    s.bytes_reserved = tp->arena.reserved;
    s.bytes_peak = tp->arena.peak;
    s.nodes = tp->n_nodes;
    return s;
}
