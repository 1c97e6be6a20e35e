// attograd/tape.h — the tape: eager ops that record themselves, and backward.
//
// An op runs its forward at once (eager) and, if any input requires grad and
// the tape's grad mode is on, appends a node to the tape. Nodes are created in
// execution order, which is already a topological order, so ag_backward is a
// single reverse walk:
//
//     for node in reversed(tape):
//         if node.out received gradient: node.op.backward(node)
//
// Memory: op outputs, their gradients, nodes and whatever an op saves for its
// backward all live in one arena owned by the tape. ag_tape_reset rewinds it;
// the arena keeps its blocks, so a training step that repeats the shapes of the
// previous one performs no heap allocation at all.
//
// One tape, one graph: an op recording on tp refuses an input that requires
// grad and was recorded on another tape (or on tp before a reset), since
// backward on tp would stop its gradient there; and a leaf that requires grad
// made on another tape (ag_tape_tensor), whose gradient would be put in tp's
// memory, gone at tp's reset. In no-grad mode such an input is just a value.
//
// What the library cannot check: a tape belongs to one thread at a time (two threads
// recording on one tape at once corrupt it; give each thread its own tape, as
// ag_data_parallel_step does). And a node points to its inputs, it does not copy them: a
// heap tensor freed, or a parameter store or tensor set freed, while a tape that read it
// may still run backward, be checked or be printed, is a use after free. Free them after
// the tape's reset (or free).
#ifndef ATTOGRAD_TAPE_H
#define ATTOGRAD_TAPE_H

#include <stdio.h>

#include "attograd/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AG_MAX_INPUTS 8

typedef struct ag_tape ag_tape;
typedef struct ag_op ag_op;

// The precision of the matrix products of float32 ops recorded on a tape (see
// ag_tape_set_autocast).
typedef enum ag_autocast {
    AG_AUTOCAST_OFF = 0,   // products in float32
    AG_AUTOCAST_BF16 = 1,  // operands rounded to bfloat16, products summed in float32
} ag_autocast;

// One recorded application of an op.
struct ag_node {
    const ag_op *op;
    ag_tape *tape;
    ag_tensor *out;
    int n_in;
    ag_tensor *in[AG_MAX_INPUTS];  // in[i]->grad is non-NULL in backward iff in[i] requires grad
    void *params;     // the op's arguments, copied into tape memory by ag_op_apply
    void *saved;      // anything forward keeps for backward (tape memory), or NULL
    bool recording;   // false in no-grad mode: forward need not save anything
    int index;        // position on the tape
    double forward_seconds, backward_seconds;  // measured when profiling is on
};

// An op is a name and a forward/backward pair. Built-in ops are defined this
// way, and so are your own (see ag_op_apply).
//   forward:  fill node->out->data from node->in[*]->data (every element).
//   backward: ACCUMULATE (+=) into node->in[i]->grad for every input whose
//             grad is non-NULL, from node->out->grad. Never overwrite: a
//             tensor used twice must receive the sum of its gradients.
// `rule` is the backward's rule in one line (softmax: "dx = y * (dy - sum(dy * y))"),
// shown by the tape's printers; NULL is fine for your own ops.
struct ag_op {
    const char *name;
    void (*forward)(ag_node *node);
    void (*backward)(ag_node *node);
    const char *rule;
};

// Every function below that takes a tape reports a NULL one (the printers a NULL stream
// too) and returns a neutral result; ag_tape_free(NULL) does nothing and
// ag_tape_autocast(NULL) is AG_AUTOCAST_OFF.
ag_tape *ag_tape_new(void);
void ag_tape_free(ag_tape *tp);
// Forgets every node and releases every tape tensor (their pointers become
// invalid); keeps the arena's memory for the next step.
void ag_tape_reset(ag_tape *tp);

// No-grad mode: ops still compute, but record nothing (inference). Returns the
// previous setting, so a scope can restore it.
bool ag_tape_set_grad_enabled(ag_tape *tp, bool enabled);
bool ag_tape_grad_enabled(const ag_tape *tp);

// Mixed precision, as PyTorch's torch.autocast on the CPU with bfloat16: with
// AG_AUTOCAST_BF16, the float32 ops recorded from then on (ag_linear, ag_matmul and the
// two products inside attention) round the operands of their matrix products to bfloat16
// and sum the products in float32, in forward and backward; their inputs, outputs and
// gradients stay float32 tensors. Everything else is unchanged: softmax, LayerNorm, the
// losses and elementwise ops compute in float32, parameters, gradient sums and optimizer
// state stay float32, and float64 ops ignore the setting (gradient checks stay exact).
// On CPUs with AVX512_BF16 the products run about twice as fast as in float32; elsewhere a
// portable path gives the same bits, slowly. An op keeps the setting it was recorded
// under, with its arguments: its backward uses it whatever the tape says by then. Off by
// default (and for a NULL tape); returns the previous setting. A NULL tape or a mode other
// than these two is reported and changes nothing.
ag_autocast ag_tape_set_autocast(ag_tape *tp, ag_autocast mode);
ag_autocast ag_tape_autocast(const ag_tape *tp);

// Tape memory: 64-byte aligned, uninitialised, valid until the next reset.
void *ag_tape_alloc(ag_tape *tp, size_t bytes);
// A zero-filled tensor in tape memory (a temporary input, a mask, a target).
ag_tensor *ag_tape_tensor(ag_tape *tp, ag_dtype dt, int ndim, const int shape[]);
// x without its history, as torch.Tensor.detach: a tensor header in tp's memory that
// shares x's data (a write to either shows in both), requires no grad and is a leaf, so
// nothing computed from it reaches x's graph. It points to x's data as it is now: valid
// until tp's reset and while that memory lives (x's own tape until its reset, a heap
// tensor until freed; a parameter's until its store grows or is resized, which moves
// its buffer). The way to cut a graph: an op's output cannot be made to stop requiring
// grad (ag_tensor_set_requires_grad refuses it, as PyTorch does for a tensor that is not
// a leaf).
ag_tensor *ag_detach(ag_tape *tp, const ag_tensor *x);

// Applies `op`: allocates the output (dtype of the first float input, shape
// `out_shape`) in tape memory, copies `params_size` bytes of `params` into tape
// memory, runs op->forward now, and records the node when any input requires
// grad and grad mode is on. Inputs of dtype AG_BOOL (masks) are carried along
// but never differentiated. All float inputs must share one dtype.
ag_tensor *ag_op_apply(ag_tape *tp, const ag_op *op, int n_in, ag_tensor *const in[],
                    int out_ndim, const int out_shape[], const void *params,
                    size_t params_size);

// To find which node's backward is wrong, check every node on its own:
// ag_tape_check (attograd/tape_check.h).

// Backpropagates from a scalar `loss` (d loss / d loss = 1), accumulating into
// the .grad of every leaf that requires grad. May be called again on the same
// tape: leaf gradients then add up (until zeroed); intermediate gradients are
// recomputed from scratch. A parameter (or a leaf that requires grad) a node read that
// was written in place since (ag_optim_step, a load, an init, ag_tensor_fill, _copy or
// _set_item) makes it refuse, naming the tensor, as PyTorch refuses a tensor saved for
// backward and modified in place: step after backward, or record the forward again
// (ag_tape_check refuses it too).
void ag_backward(ag_tape *tp, ag_tensor *loss);
// Same, with an explicit upstream gradient `dy`: y's shape, f32 or f64 (another float
// dtype than y's is converted, as PyTorch converts it).
void ag_backward_with(ag_tape *tp, ag_tensor *y, const ag_tensor *dy);

int ag_tape_num_nodes(const ag_tape *tp);
// Node i, in order of recording; an i outside [0, num_nodes) is reported, giving NULL.
ag_node *ag_tape_node(const ag_tape *tp, int i);

typedef struct ag_tape_stats {
    size_t bytes_used;      // arena bytes in use since the last reset
    size_t bytes_reserved;  // arena bytes owned
    size_t bytes_peak;      // largest bytes_used ever seen
    int nodes;
} ag_tape_stats;
ag_tape_stats ag_tape_usage(const ag_tape *tp);

// Lists the nodes, one per line: index, op, input and output shapes, after a
// backward the L2 norm of the output gradient, and with profiling on the time
// each node's forward and backward took.
void ag_tape_print(const ag_tape *tp, FILE *f);
// The same listing with each node's backward rule on a line under it (what
// backward will do there: "rule: dx = y * (dy - sum(dy * y))").
void ag_tape_print_verbose(const ag_tape *tp, FILE *f);

// Profiling: when on, every recorded node measures its forward and backward
// wall time (two clock reads per call; off by default).
void ag_tape_set_profiling(ag_tape *tp, bool on);
// One line per op name, slowest first: calls, forward and backward
// milliseconds summed over the tape's nodes, and the share of the total.
void ag_tape_profile_print(const ag_tape *tp, FILE *f);
// Writes the graph in Graphviz DOT: one box per tensor (name, shape, a few
// values and gradient entries, norms) and one ellipse per op, labelled with its
// index, its name and its backward rule. Render with
// `dot -Tsvg`. Numbers take '.' whatever the locale (setlocale), so the file is the same
// bytes in every program; the listings above follow the locale, as printf does.
void ag_tape_dot(const ag_tape *tp, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
