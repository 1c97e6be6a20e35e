// One node of a tape run alone, on a scratch copy: its forward replayed, its backward run
// from any upstream gradient, and the tape left as it was. The copy has its own output,
// its own copies of the inputs it differentiates (with their own gradients), and a private
// tape, so whatever the op allocates or saves (node->saved) lands there. What the node
// does not own is shared read-only: its params (dropout, seeded by them, replays the same
// mask) and the inputs it does not differentiate (masks, indices, float inputs that do not
// require grad).
//
// ag_tape_check (tape_check.c) compares such a backward with finite differences; a tape's
// HTML page (src/io/tape_html.c) shows what each node's backward sends to each input.
#ifndef ATTOGRAD_OPS_NODE_REPLAY_H
#define ATTOGRAD_OPS_NODE_REPLAY_H

#include "../core/internal.h"

// The scratch copy of one node, in the node's own dtype or promoted to f64. Its inputs'
// values before any perturbation are the node's own (n->in[k]).
typedef struct agi_replay {
    ag_node node;
    ag_tensor in[AG_MAX_INPUTS], out;
    bool diff[AG_MAX_INPUTS];    // input k is differentiated (float, requires grad)
    double *ana[AG_MAX_INPUTS];  // analytic (J^T v) for input k
    void *y;                     // the replay's output
    ag_tape *tape;     // what the op allocates or saves: reset before every forward
    ag_tape *buffers;  // the buffers above: reset per node, so its blocks are reused
    int runs;
} agi_replay;

// Element i of `buf`, laid out as t (any dtype), as a double; and the reverse.
double agi_replay_get(const ag_tensor *t, const void *buf, size_t i);
void agi_replay_set(const ag_tensor *t, void *buf, size_t i, double v);
size_t agi_replay_bytes(const ag_tensor *t);

// The scratch copy of node n running `op`, with its float tensors in dtype dt (the node's
// own, or f64 for its f64 twin), its buffers in `buffers`.
void agi_replay_init(agi_replay *s, const ag_node *n, const ag_op *op, ag_dtype dt,
                     ag_tape *tape, ag_tape *buffers);
// One forward of the copy into `out` (s->y for the replay itself; any buffer of the
// output's size), which starts as NaN: an element the forward leaves unwritten shows.
void agi_replay_forward(agi_replay *s, void *out);
// One backward from the upstream gradient in s->out.grad (set it first, in the output's
// dtype) into input gradients that start at start[k]: ana[k] = what the backward added to
// input k's.
void agi_replay_backward(agi_replay *s, double *const start[]);
// The largest |replayed output - recorded output| (s->y against `recorded`, the node's
// own output): 0 unless an input changed since recording; NaN where only one is NaN.
double agi_replay_diff(const agi_replay *s, const ag_tensor *recorded);

// What node n's backward sends to each input from the gradient its output holds now:
// sends[k] (numel of input k doubles; NULL to skip an input) receives what the backward
// adds to input k's gradient, or stays untouched when input k is not differentiated
// (then differentiated[k] is false). The node's forward is replayed first, since the
// backward reads what it saves; *replay_diff is the largest difference between the
// replayed output and the recorded one (0 unless an input changed since recording).
// Returns false, touching nothing, when the op has no backward or the output no gradient.
bool agi_node_sends(const ag_node *n, double *const sends[], bool differentiated[],
                    double *replay_diff);

#endif
