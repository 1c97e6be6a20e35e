// attograd/tape_html.h — a recorded tape as one web page, for teaching backpropagation
// and for looking inside a model.
//
//     ag_backward(tp, loss);                     // values and gradients to show
//     ag_tape_check_report r;                    // optional: each node's own check
//     ag_tape_check(tp, NULL, &r);
//     ag_tape_html_opts o = ag_tape_html_defaults();
//     o.title = "attention, one head";
//     o.check = &r;
//     ag_err err;
//     if (ag_tape_html(tp, "tape.html", &o, &err)) fprintf(stderr, "%s\n", err.msg);
//
// The page is one file: its style, script and pictures are inside it, it loads nothing
// (a Content-Security-Policy forbids every request), and it opens from a file:// URL in
// any current browser, years from now. It shows
//   - the graph, top to bottom by layers: one box per node (index, op, the output's name
//     and shape, the leaves it reads); a tape of more than max_nodes nodes shows each run
//     of repeated blocks (the layers of a model) collapsed, a click opening one;
//   - for the node selected: its op, the shapes, the backward rule, its inputs, its value,
//     the gradient arriving at its output, what its backward sends to each input (the node
//     replayed alone, so a tensor used twice shows each share; node_replay.h), and its
//     own finite-difference check when `check` holds ag_tape_check's report. A small
//     tensor is printed in full; a larger one is drawn as a heatmap, its values on hover;
//   - step controls: the forward pass node by node, then the backward pass, the current
//     node and the edges its gradient travels highlighted. Keys: right/left arrow (or j/k)
//     step, Home/End, f/b jump to the forward or backward pass; Tab reaches every box.
//     The URL's fragment names the step (#f3: forward at node 3, #b3: backward), so a link
//     opens a lesson at that step.
// Every number is written with `digits` significant digits, rounded once, here.
//
// Names (tensor names, op names, rules, notes, the title) are the caller's text: the page
// shows them as text, never as markup. The file is written atomically (attograd/io.h):
// a failure leaves what was at `path` before.
#ifndef ATTOGRAD_TAPE_HTML_H
#define ATTOGRAD_TAPE_HTML_H

#include "attograd/tape.h"
#include "attograd/tape_check.h"

#ifdef __cplusplus
extern "C" {
#endif

// A few words shown with a tensor (a node's output or a leaf), e.g. why its gradient is 0.
typedef struct ag_tape_html_note {
    const ag_tensor *tensor;
    const char *text;
} ag_tape_html_note;

typedef struct ag_tape_html_opts {
    const char *title;  // the page's title; NULL for "attograd tape"
    int digits;         // significant digits of every number: 4 (1 to 17)
    // A tensor is seen as a matrix: its last dim across, all others stacked down. One of at
    // most max_full elements and at most 8 columns is printed in full (64); a larger one is
    // a heatmap of its first max_rows x max_cols entries (64 x 64, each 1 to 1024), with
    // its minimum, maximum, norm and count of NaN and infinite entries over all of it.
    int max_full;
    int max_rows, max_cols;
    int max_nodes;      // a tape of more nodes collapses its repeated blocks: 40 (>= 1)
    // Gradient entries (a tensor's, and what a node sends) smaller in magnitude than this
    // are shown as 0, and the page says how many: the rounding float arithmetic leaves
    // where exact arithmetic gives 0 (a key bias's gradient, 1e-19). 0: all as computed.
    double zero_below;
    const ag_tape_check_report *check;  // ag_tape_check's report on this tape, or NULL
    const ag_tape_html_note *notes;     // n_notes notes, or NULL
    int n_notes;
} ag_tape_html_opts;

ag_tape_html_opts ag_tape_html_defaults(void);

// Writes the page of `tp` (after a forward, and a backward for gradients) to `path`;
// `opts` may be NULL for the defaults. Returns 0, or -1 with one line in err (a file
// problem). A NULL tape, options out of range or a report of another tape (another node
// count, or a node whose op or output shape differs) are programming errors (ag_error),
// and return -1 too.
int ag_tape_html(const ag_tape *tp, const char *path, const ag_tape_html_opts *opts,
                 ag_err *err);

#ifdef __cplusplus
}
#endif
#endif
