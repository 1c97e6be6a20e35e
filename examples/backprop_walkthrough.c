// backprop_walkthrough: attention's backward, node by node, for people learning
// backpropagation.
//
// Part 1 redoes the worked example of the multi-head attention notes (a 4x4 score
// matrix, scaled by 1/sqrt(64) = 1/8, softmax row by row, weighted sum) from projections
// that give exactly the notes' scores, and walks its backward from the loss to dQ, dK,
// dV and the projection weights, with one matrix-product gradient written out entry by
// entry. Part 2 runs a tiny torch.nn.MultiheadAttention (4 tokens, E = 8, 2 heads)
// forward node by node, then its backward node by node: for each node its rule, the
// gradient arriving from above, the gradients it sends to its inputs, and a finite-
// difference check of that node alone (ag_tape_check). Each part writes its graph as a
// web page (ag_tape_html) and as Graphviz DOT, rendered to SVG when `dot` is installed.
//
//     ./build/examples/backprop_walkthrough [out.dot]
//
// writes out.dot, out.html (the attention) and out_notes.dot, out_notes.html (the worked
// example), and the SVGs.
//
// Numbers are printed with 4 significant digits (%.4g), so that a gradient of 1e-5
// shows as 1e-05, not as 0.0000. A gradient that is exactly 0 in exact arithmetic, as the
// key bias's is (softmax is shift-invariant: see Part 1), comes out of float64 as rounding
// of about 1e-16 of its terms; the walkthrough checks that it is within that rounding,
// says so, and writes the 0 it is before printing and drawing it.
//
// Exit status 0 when every node passes its check, the nodes carry their names, the
// hand-run backward gives exactly ag_backward's gradients and the zero gradients are
// within rounding of 0; 1 when one of these fails or a file cannot be written; 2 for a
// bad command line.
#define _POSIX_C_SOURCE 200809L  // fork, execlp, waitpid
#include <attograd.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/flags.h"
#include "common/path.h"
#include "common/staged_file.h"

// ---- Printing every entry of a small tensor ------------------------------------------------

// An entry as printed: 4 significant digits; -0 prints as 0.
static void entry(double v) { printf(" %10.4g", v + 0.0); }

// A tensor's values (or its gradient) as matrices over its last two dims, every entry.
static void show(const char *label, const ag_tensor *t, bool grad) {
    char sh[64];
    ag_tensor_shape_str(t, sh, sizeof sh);
    if (grad && !t->grad) {
        printf("    %s %s: no gradient\n", label, sh);
        return;
    }
    ag_tensor view = grad ? ag_tensor_grad_view(t) : *t;
    printf("    %s %s\n", label, sh);
    int cols = t->ndim ? t->shape[t->ndim - 1] : 1;
    int rows = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    size_t matrices = t->numel / ((size_t)cols * (size_t)rows);
    for (size_t m = 0; m < matrices; m++) {
        if (matrices > 1) {  // which matrix: its leading indices
            printf("      [");
            size_t rest = m;
            int lead = t->ndim - 2, idx[AG_MAX_DIMS] = {0};
            for (int d = lead - 1; d >= 0; d--) {
                idx[d] = (int)(rest % (size_t)t->shape[d]);
                rest /= (size_t)t->shape[d];
            }
            for (int d = 0; d < lead; d++) printf("%d,", idx[d]);
            printf(":,:]\n");
        }
        for (int r = 0; r < rows; r++) {
            printf("     ");
            for (int c = 0; c < cols; c++)
                entry(ag_tensor_item(&view, (m * (size_t)rows + (size_t)r) * cols + c));
            printf("\n");
        }
    }
}

static const char *name_of(const ag_tensor *t, char *buf, size_t size) {
    if (t->name) return t->name;
    if (t->node) snprintf(buf, size, "#%d %s", t->node->index, t->node->op->name);
    else snprintf(buf, size, "(unnamed leaf)");
    return buf;
}

static void heading(const char *s) { printf("\n==== %s ====\n\n", s); }

// ---- Gradients that are 0 in exact arithmetic ----------------------------------------------
// A bias added to every key gets as gradient the sum over the keys (rows) of dK, and that
// sum is 0: see Part 1. float64 leaves rounding there, of about 1e-16 of the terms summed.
// If every entry of the bias gradient `g` (a view of `cols` entries) is within 1000 eps of
// the magnitudes it sums (the column sums of |dy|, rows of `cols` entries), writes the exact
// 0 into it and returns the largest magnitude replaced; returns -1, changing nothing, if
// an entry is larger: then the gradient is not 0 and something is wrong.
static double rounding_to_zero(ag_tensor *g, const ag_tensor *dy) {
    ag_tensor dyv = ag_tensor_grad_view(dy);
    size_t cols = g->numel, rows = dy->numel / cols;
    double largest = 0;
    for (size_t c = 0; c < cols; c++) {
        double terms = 0;
        for (size_t r = 0; r < rows; r++) terms += fabs(ag_tensor_item(&dyv, r * cols + c));
        double v = fabs(ag_tensor_item(g, c));
        if (!(v <= 1e3 * DBL_EPSILON * terms)) return -1;
        largest = fmax(largest, v);
    }
    for (size_t c = 0; c < cols; c++) ag_tensor_set_item(g, c, 0.0);
    return largest;
}

// ---- The files: graphs as DOT (and SVG), and as a web page -----------------------------------

// A graph file, opened before any work so that a path that cannot be written stops the
// program at once, with one line. `path` ends in .dot; the page goes beside it as .html.
// Written atomically (staged_file.h), as the page is, and both paths checked before any
// work: opened with fopen, the notes' .dot was emptied before the attention's path was
// found unwritable (a directory), and the run stopped.
typedef struct {
    const char *path;
    char html[1024];
} graph_file;

static bool open_graph(graph_file *g, const char *path) {
    g->path = path;
    if (!path_beside(g->html, sizeof g->html, path, ".dot", ".html")) {
        fprintf(stderr, "backprop_walkthrough: the path %s is too long\n", path);
        return false;
    }
    ag_err err;
    if (ag_file_path_check(path, &err) == 0) return true;
    fprintf(stderr, "backprop_walkthrough: cannot write %s\n", err.msg);
    return false;
}

// dot -Tsvg DOT -o SVG, run without a shell: the paths pass as they are. Through
// system() they were quoted in '...', so a path holding a quote ("it's.dot") reached dot
// as other arguments, and a crafted one ran commands of its own.
static bool run_dot(const char *dot_path, const char *svg) {
    fflush(NULL);  // the child's exec discards its copies of the buffers
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        execlp("dot", "dot", "-Tsvg", dot_path, "-o", svg, (char *)NULL);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Writes the tape as DOT to g (and closes it) and, when Graphviz is installed, renders it
// to the same path with .svg for .dot. Returns false if either step failed.
static bool write_graph(const ag_tape *tp, graph_file *g) {
    const char *dot_path = g->path;
    staged_file out;
    ag_err err;
    FILE *f = staged_open(&out, dot_path, &err);
    if (f) ag_tape_dot(tp, f);
    if (!f || !staged_commit(&out, dot_path, &err)) {
        fprintf(stderr, "backprop_walkthrough: cannot write %s: %s\n", dot_path, err.msg);
        return false;
    }
    printf("wrote %s (every tensor with its values and gradient, every op with its rule)\n",
           dot_path);
    char svg[1024];
    if (!path_beside(svg, sizeof svg, dot_path, ".dot", ".svg")) {
        fprintf(stderr, "backprop_walkthrough: the path %s is too long\n", dot_path);
        return false;
    }
    if (system("command -v dot > /dev/null 2>&1") != 0) {
        printf("Graphviz dot is not installed: skipping the rendering "
               "(apt-get install graphviz)\n");
        return true;
    }
    if (!run_dot(dot_path, svg)) {
        fprintf(stderr, "backprop_walkthrough: dot failed on %s\n", dot_path);
        return false;
    }
    printf("rendered %s\n", svg);
    return true;
}

// Writes the tape's web page beside its .dot: every node with its values, gradients, rule,
// what it sends and its own check, stepped forward and backward in a browser.
static bool write_page(const ag_tape *tp, const graph_file *g, const char *title,
                       const ag_tape_check_report *check, const ag_tape_html_note *notes,
                       int n_notes) {
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.title = title;
    o.check = check;
    o.notes = notes;
    o.n_notes = n_notes;
    // What a node sends is recomputed for the page, key bias included: its rounding (about
    // 1e-16 of the terms, gradients here being 1e-5 and more) shows as the 0 it is.
    o.zero_below = 1e-12;
    ag_err err;
    if (ag_tape_html(tp, g->html, &o, &err)) {
        fprintf(stderr, "backprop_walkthrough: %s\n", err.msg);
        return false;
    }
    printf("wrote %s (open it in a browser: the graph, stepped forward and backward)\n",
           g->html);
    return true;
}

// ---- Part 1: the worked example of the notes -------------------------------------------------

// S_1 = Q_1 K_1^T and the softmax A_1 as the notes print them ("Step-by-Step Computation").
static const double notes_scores[16] = {20.5, 15.2, 8.3,  12.1, 16.8, 22.3, 10.5, 14.2,
                                        9.2,  11.5, 19.8, 7.6,  13.4, 15.1, 9.9,  21.2};
static const double notes_softmax[16] = {0.48, 0.25, 0.10, 0.17, 0.18, 0.51, 0.10, 0.21,
                                         0.12, 0.16, 0.62, 0.10, 0.16, 0.19, 0.10, 0.55};

// What gives exactly the notes' S: 4 tokens of 4 features (X, one token a row) and
// projections as torch.nn.Linear makes them, y = x W^T + b (the notes' W^Q is W_q^T),
// with K = X W_k^T of small integers, W_q = the one making Q K^T = S, and the biases at 0
// as PyTorch starts them. X and K have integer inverses, so W_q has one decimal, as S does.
// The notes give no V: this W_v makes V = [1 0; 0 1; 2 1; -1 3]. Chosen (by a search) so
// that no column of X or K is constant and no gradient entry but the key bias's is 0.
static const double X_init[16] = {0, -1, -1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1};
static const double Wq_init[16] = {-4.3,  -5,   10.4,  -8.2, -21,   16.8, -23.9, 13.4,
                                   -25.9, 22.3, -22.4, 15.1, -27.8, 14.2, -5.1,  21.2};
static const double Wk_init[16] = {-1, 0, 0, 0, -1, 0, -1, 0, 0, 1, -1, 0, -1, 0, 1, 1};
static const double Wv_init[8] = {3, 0, -2, -1, -3, 1, 2, 3};
// loss = sum(G * O): any weighting of O's entries; then dO = G.
static const double G_init[8] = {1, -1, 2, 1, -1, 1, 1, 2};

// The tensors of Part 1, by their names in the notes.
typedef struct {
    ag_tensor *X, *Wq, *bq, *Wk, *bk, *Wv, *bv, *G;               // leaves
    ag_tensor *Q, *K, *V, *S, *S8, *A, *O, *GO, *loss;          // on the tape
} worked;

static ag_tensor *leaf(const char *name, int rows, int cols, const double *values) {
    ag_tensor *t = values ? ag_tensor_from(AG_F64, 2, (int[]){rows, cols}, values)
                          : ag_tensor_zeros(AG_F64, 1, (int[]){cols});
    ag_tensor_set_name(t, name);
    ag_tensor_set_requires_grad(t, true);
    return t;
}

static void worked_forward(ag_tape *tp, worked *w) {
    w->X = leaf("X", 4, 4, X_init);
    w->Wq = leaf("W_q", 4, 4, Wq_init);
    w->bq = leaf("b_q", 0, 4, NULL);
    w->Wk = leaf("W_k", 4, 4, Wk_init);
    w->bk = leaf("b_k", 0, 4, NULL);
    w->Wv = leaf("W_v", 2, 4, Wv_init);
    w->bv = leaf("b_v", 0, 2, NULL);
    w->G = ag_tensor_from(AG_F64, 2, (int[]){4, 2}, G_init);
    ag_tensor_set_name(w->G, "G");
    w->Q = ag_linear(tp, w->X, w->Wq, w->bq);
    w->K = ag_linear(tp, w->X, w->Wk, w->bk);
    w->V = ag_linear(tp, w->X, w->Wv, w->bv);
    w->S = ag_matmul(tp, w->Q, w->K, false, true);
    w->S8 = ag_scale(tp, w->S, 1.0 / sqrt(64.0));
    w->A = ag_softmax(tp, w->S8, NULL);
    w->O = ag_matmul(tp, w->A, w->V, false, false);
    w->GO = ag_mul(tp, w->G, w->O);
    w->loss = ag_sum(tp, w->GO);
    const char *names[] = {"Q", "K", "V", "S", "S/8", "A", "O", "G*O", "loss"};
    ag_tensor *outs[] = {w->Q, w->K, w->V, w->S, w->S8, w->A, w->O, w->GO, w->loss};
    for (int i = 0; i < 9; i++) ag_tensor_set_name(outs[i], names[i]);
}

static void worked_free(worked *w) {
    ag_tensor *leaves[] = {w->X, w->Wq, w->bq, w->Wk, w->bk, w->Wv, w->bv, w->G};
    for (int i = 0; i < 8; i++) ag_tensor_free(leaves[i]);
}

static double at(const ag_tensor *t, bool grad, int r, int c) {
    ag_tensor v = grad ? ag_tensor_grad_view(t) : *t;
    return ag_tensor_item(&v, (size_t)r * (size_t)t->shape[t->ndim - 1] + (size_t)c);
}

// Prints the forward and checks the notes' numbers; false if S is not the notes' S.
static bool worked_print_forward(const worked *w) {
    printf("Forward (values to 4 significant digits):\n");
    show("X (4 tokens, one a row)", w->X, false);
    show("W_q", w->Wq, false);
    show("W_k", w->Wk, false);
    show("W_v", w->Wv, false);
    printf("    b_q, b_k, b_v: 0\n");
    show("Q = X W_q^T + b_q", w->Q, false);
    show("K = X W_k^T + b_k", w->K, false);
    show("V = X W_v^T + b_v", w->V, false);
    show("S = Q K^T", w->S, false);
    double off = 0;
    for (int i = 0; i < 16; i++) off = fmax(off, fabs(at(w->S, false, i / 4, i % 4) -
                                                     notes_scores[i]));
    printf("    S is the notes' S_1 (largest difference %.1g: one-decimal numbers are not exact "
           "in binary)\n", off);
    show("S/8 = S / sqrt(64)", w->S8, false);
    printf("    row 0: exp(S/8) =");
    double sum = 0;
    for (int j = 0; j < 4; j++) {
        printf(" %.4f", exp(at(w->S8, false, 0, j)));
        sum += exp(at(w->S8, false, 0, j));
    }
    printf(", sum %.4f (the notes: 12.94 6.69 2.83 4.53, sum 26.99: they rounded S/8 first)\n",
           sum);
    show("A = softmax(S/8), row by row", w->A, false);
    printf("    against the notes' A_1 (printed to 2 decimals):\n");
    int wrong = 0;
    for (int i = 0; i < 4; i++) {
        double worst = 0;
        for (int j = 0; j < 4; j++)
            worst = fmax(worst, fabs(at(w->A, false, i, j) - notes_softmax[4 * i + j]));
        bool agrees = worst <= 0.005 + 1e-12;
        wrong += !agrees;
        printf("      row %d  notes:", i);
        for (int j = 0; j < 4; j++) printf(" %.2f", notes_softmax[4 * i + j]);
        printf("   correct:");
        for (int j = 0; j < 4; j++) printf(" %.4f", at(w->A, false, i, j));
        printf("   %s\n", agrees ? "agrees" : "WRONG in the notes");
    }
    printf("    %d of 4 rows of the notes' softmax are wrong; the values above are the right ones\n"
           "    (torch.softmax(S / 8, dim=1) gives the same).\n",
           wrong);
    show("O = A V", w->O, false);
    show("G (the loss's weights)", w->G, false);
    printf("    loss = sum of G * O = %.4g\n", ag_tensor_item(w->loss, 0));
    return off < 1e-12;
}

// What each node of Part 1's backward teaches, after its rule and its gradients.
static void worked_lesson(const worked *w, const ag_node *nd, double bk_rounding) {
    const ag_tensor *y = nd->out;
    if (y == w->loss) {
        printf("    d(loss) = 1, and every entry of G*O adds to the loss once\n");
        show("d(G*O)", w->GO, true);
    } else if (y == w->GO) {
        show("dO = d(G*O) * G = G", w->O, true);
    } else if (y == w->O) {
        show("dA = dO V^T", w->A, true);
        show("dV = A^T dO", w->V, true);
        printf("    a value is pushed by exactly the attention weights that read it: "
               "dV = A^T G\n");
    } else if (y == w->A) {
        show("d(S/8) = A * (dA - rowsum(dA * A))", w->S8, true);
        double dot = 0;
        for (int j = 0; j < 4; j++) dot += at(w->A, true, 0, j) * at(w->A, false, 0, j);
        printf("    by hand, row 0: sum(dA * A) = %.4g, so d(S/8)[0][j] = A[0][j] (dA[0][j] %s "
               "%.4g) =", dot, dot < 0 ? "+" : "-", fabs(dot));
        for (int j = 0; j < 4; j++)
            printf(" %.4g", at(w->A, false, 0, j) * (at(w->A, true, 0, j) - dot));
        printf("\n    A score goes up where its weight's dA beats the weighted average, down "
               "where\n    it does not. Every row of d(S/8) sums to 0 (since sum_j A_ij = 1): "
               "adding one\n    number to a whole row of scores changes no weight, so it "
               "cannot move the loss.\n    Row sums here:");
        for (int i = 0; i < 4; i++) {
            double rs = 0;
            for (int j = 0; j < 4; j++) rs += at(w->S8, true, i, j);
            printf(" %.1g", rs);
        }
        printf(" (float64 rounding of 0)\n");
    } else if (y == w->S8) {
        show("dS = d(S/8) / 8", w->S, true);
    } else if (y == w->S) {
        show("dQ = dS K", w->Q, true);
        show("dK = dS^T Q", w->K, true);
        // One entry of dK, as the dot product it is.
        const int j = 1, c = 2;
        printf("    one entry by hand: dK[%d][%d] = column %d of dS . column %d of Q\n", j, c,
               j, c);
        printf("      = dS[0][%d] Q[0][%d] + dS[1][%d] Q[1][%d] + dS[2][%d] Q[2][%d] + "
               "dS[3][%d] Q[3][%d]\n      =", j, c, j, c, j, c, j, c);
        double sum = 0;
        for (int i = 0; i < 4; i++) {
            printf("%s (%.4g)(%.4g)", i ? " +" : "", at(w->S, true, i, j),
                   at(w->Q, false, i, c));
            sum += at(w->S, true, i, j) * at(w->Q, false, i, c);
        }
        printf("\n      =");
        for (int i = 0; i < 4; i++) {
            double term = at(w->S, true, i, j) * at(w->Q, false, i, c);
            if (i) printf(" %s %.4g", term < 0 ? "-" : "+", fabs(term));
            else printf(" %.4g", term);
        }
        printf(" = %.4g   (the tape: %.4g)\n", sum, at(w->K, true, j, c));
    } else if (y == w->V) {
        show("dW_v = dV^T X", w->Wv, true);
        show("db_v = sum over the rows of dV", w->bv, true);
        printf("    (each row of A sums to 1, so the rows of dV = A^T G add up to those of G)\n");
    } else if (y == w->K) {
        show("dW_k = dK^T X", w->Wk, true);
        show("db_k = sum over the rows of dK", w->bk, true);
        printf("    d(b_k) is exactly 0. b_k is added to every key, so it adds q_i . b_k to "
               "every\n    score of row i, the same number for every key j; softmax does not "
               "change when\n    one number is added to a whole row (it is shift-invariant), "
               "so b_k cannot\n    change the loss. In the numbers: the sum over j of dK[j][c] "
               "is\n    sum_i Q[i][c] (sum_j dS[i][j]), and every row of dS sums to 0. float64 "
               "left\n    rounding of at most %.1g there (its terms are of size 1); the "
               "walkthrough\n    writes the 0 it is. torch.nn.MultiheadAttention has this bias "
               "too, and its\n    gradient is always 0 (Part 2 shows it again).\n",
               bk_rounding);
    } else if (y == w->Q) {
        show("dW_q = dQ^T X", w->Wq, true);
        show("db_q = sum over the rows of dQ", w->bq, true);
    }
}

static void worked_print_backward(const ag_tape *tp, const worked *w, double bk_rounding) {
    printf("\nBackward, from the loss up: each node applies its rule to the gradient arriving "
           "at\nits output (d of the loss with respect to that tensor) and sends the results "
           "to its\ninputs:\n");
    for (int i = ag_tape_num_nodes(tp) - 1; i >= 0; i--) {
        const ag_node *nd = ag_tape_node(tp, i);
        printf("  #%d %s -> %s    rule: %s\n", i, nd->op->name, nd->out->name, nd->op->rule);
        worked_lesson(w, nd, bk_rounding);
    }
    printf("  X is read by the three projections: its gradient is the sum of what they send,\n"
           "  dQ W_q + dK W_k + dV W_v\n");
    show("dX", w->X, true);
}

static bool worked_example(graph_file *graph) {
    heading("Part 1: the worked example, from the loss to dQ, dK, dV and the projections");
    printf("The notes (\"Step-by-Step Computation\") start from a score matrix S_1 = Q_1 K_1^T\n"
           "of 4 tokens (their d_k = 64), scale it by 1/sqrt(64) = 1/8, take a softmax row by\n"
           "row and weight the values. They give S, not what it came from. Here is an\n"
           "upstream that gives exactly their S and is small enough to print: 4 tokens of 4\n"
           "features, projections as torch.nn.Linear computes them (Q = X W_q^T + b_q: the\n"
           "notes' W^Q is W_q^T), d_k = 4 columns instead of 64 but the notes' 1/8 kept, so\n"
           "that their numbers come out. The biases start at 0, as PyTorch starts them.\n\n");
    ag_tape *tp = ag_tape_new();
    worked w;
    worked_forward(tp, &w);
    bool ok = worked_print_forward(&w);

    ag_backward(tp, w.loss);
    ag_tensor bk_grad = ag_tensor_grad_view(w.bk);
    double bk_rounding = rounding_to_zero(&bk_grad, w.K);
    if (bk_rounding < 0) {
        printf("backprop_walkthrough: d(b_k) is not within rounding of 0\n");
        ok = false;
    }
    worked_print_backward(tp, &w, bk_rounding);

    // The tape's own check of every node, for the text and for the page.
    ag_tape_check_report r;
    ok = ag_tape_check(tp, NULL, &r) && ok;
    printf("\nEach node checked on its own by finite differences (ag_tape_check):\n");
    ag_tape_check_print(&r, stdout);

    char dk_note[400];
    snprintf(dk_note, sizeof dk_note,
             "dK = dS^T Q: entry [1][2] is column 1 of dS dotted with column 2 of Q, "
             "(%.4g)(%.4g) + (%.4g)(%.4g) + (%.4g)(%.4g) + (%.4g)(%.4g) = %.4g.",
             at(w.S, true, 0, 1), at(w.Q, false, 0, 2), at(w.S, true, 1, 1),
             at(w.Q, false, 1, 2), at(w.S, true, 2, 1), at(w.Q, false, 2, 2),
             at(w.S, true, 3, 1), at(w.Q, false, 3, 2), at(w.K, true, 1, 2));
    const ag_tape_html_note notes[] = {
        {w.S, "S = Q K^T is the notes' S_1 exactly (their step 2)."},
        {w.A, "The notes print rows 1 to 3 of this softmax wrongly: these are right "
              "(torch.softmax gives the same)."},
        {w.K, dk_note},
        {w.bk, "d(b_k) is exactly 0: b_k adds the same number q_i . b_k to every score of "
               "row i, and softmax does not change when one number is added to a whole row. "
               "Every row of d(S/8) sums to 0, so the rows of dK sum to 0. float64 leaves "
               "rounding of about 1e-16 there; it is shown as the 0 it is."},
        {w.X, "X is read by the three projections: its gradient is the sum of what they "
              "send."},
    };
    ok = write_graph(tp, graph) && ok;
    ok = write_page(tp, graph, "attention backward: the notes' worked example", &r, notes,
                    (int)(sizeof notes / sizeof notes[0])) && ok;
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    worked_free(&w);
    return ok;
}

// ---- Part 2: a tiny MultiheadAttention, node by node ------------------------------------------

// ---- Naming the nodes of ag_mha_forward's unfused path (the one that returns the weights) --
// Each node is found by its op and by what it reads (its role), not by its place on the
// tape: the order of the projections and head splits may change without the names going
// wrong.

// The node applying `op` to `a` (and to `b` unless NULL) as its first inputs, or NULL.
static ag_node *node_of(const ag_tape *tp, const char *op, const ag_tensor *a,
                        const ag_tensor *b) {
    for (int i = 0; a && i < ag_tape_num_nodes(tp); i++) {
        ag_node *nd = ag_tape_node(tp, i);
        if (!strcmp(nd->op->name, op) && nd->in[0] == a && (!b || (nd->n_in > 1 && nd->in[1] == b)))
            return nd;
    }
    return NULL;
}

// The projection by part p (0: q, 1: k, 2: v) of the packed in_proj_weight: the linear
// node whose weight is the view of rows [p E, (p + 1) E).
static ag_node *projection(const ag_tape *tp, const ag_mha *m, int p) {
    int E = m->cfg.embed_dim;
    const double *rows = ag_tensor_f64(m->in_proj_weight) + (size_t)p * E * E;
    for (int i = 0; i < ag_tape_num_nodes(tp); i++) {
        ag_node *nd = ag_tape_node(tp, i);
        if (!strcmp(nd->op->name, "linear") && nd->in[1]->data == rows) return nd;
    }
    return NULL;
}

// Names every node's output (and the projections' weight and bias views). Returns false
// when a node is not where its role says it should be, or a node is left unnamed.
static bool name_nodes(ag_tape *tp, const ag_mha *m) {
    static const char *proj[3] = {"q", "k", "v"}, *heads[3] = {"q heads", "k heads", "v heads"};
    static const char *views[3][2] = {{"Wq = in_proj_weight[0:8]", "bq = in_proj_bias[0:8]"},
                                      {"Wk = in_proj_weight[8:16]", "bk = in_proj_bias[8:16]"},
                                      {"Wv = in_proj_weight[16:24]", "bv = in_proj_bias[16:24]"}};
    ag_node *h[3];
    for (int p = 0; p < 3; p++) {
        ag_node *nd = projection(tp, m, p);
        if (!nd) return false;
        ag_tensor_set_name(nd->out, proj[p]);
        // Views of the packed tensors: their gradients land in in_proj_weight and _bias.
        ag_tensor_set_name(nd->in[1], views[p][0]);
        if (nd->n_in > 2) ag_tensor_set_name(nd->in[2], views[p][1]);
        if (!(h[p] = node_of(tp, "split_heads", nd->out, NULL))) return false;
        ag_tensor_set_name(h[p]->out, heads[p]);
    }
    ag_node *scores = node_of(tp, "matmul", h[0]->out, h[1]->out);
    ag_node *a = scores ? node_of(tp, "softmax", scores->out, NULL) : NULL;
    ag_node *av = a ? node_of(tp, "matmul", a->out, h[2]->out) : NULL;
    ag_node *merged = av ? node_of(tp, "merge_heads", av->out, NULL) : NULL;
    ag_node *out = merged ? node_of(tp, "linear", merged->out, NULL) : NULL;
    ag_node *loss = out ? node_of(tp, "mse", out->out, NULL) : NULL;
    if (!loss) return false;
    ag_tensor_set_name(scores->out, "scores");
    ag_tensor_set_name(a->out, "A");
    ag_tensor_set_name(av->out, "A v");
    ag_tensor_set_name(merged->out, "heads side by side");
    ag_tensor_set_name(out->out, "out");
    ag_tensor_set_name(loss->out, "loss");
    for (int i = 0; i < ag_tape_num_nodes(tp); i++)
        if (!ag_tape_node(tp, i)->out->name) return false;
    return true;
}

static double *copy_grad(const ag_tensor *t) {
    double *g = malloc(t->numel * sizeof *g);
    for (size_t i = 0; i < t->numel; i++) g[i] = ag_tensor_grad_item(t, i);
    return g;
}

static void print_check(const ag_tape_check_entry *e) {
    printf("    finite-difference check of this node alone: %s, %d %s, max abs error %.1e, "
           "max rel error %.1e\n",
           ag_check_verdict_name(e->fd.verdict), e->fd.comparisons,
           e->fd.elementwise ? "elements" : "random directions", e->fd.max_abs_err,
           e->fd.max_rel_err);
}

static bool tiny_mha(graph_file *graph) {
    heading("Part 2: MultiheadAttention, 4 tokens, E = 8, 2 heads (float64)");
    ag_pcg32 rng = ag_pcg32_make(2024, 1);
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2};
    if (!ag_mha_init(&m, ps, "attn", &cfg, &rng)) {
        ag_params_free(ps);
        return false;
    }
    ag_tensor *x = ag_tensor_uniform(AG_F64, 3, (int[]){1, 4, 8}, &rng, -1, 1);
    ag_tensor *target = ag_tensor_uniform(AG_F64, 3, (int[]){1, 4, 8}, &rng, -1, 1);
    ag_tensor_set_name(x, "x"), ag_tensor_set_name(target, "target");
    ag_tensor_set_requires_grad(x, true);

    ag_tape *tp = ag_tape_new();
    ag_tensor *weights;  // asking for the weights runs the ops one by one (no fused kernel)
    ag_tensor *out = ag_mha_forward(tp, &m, x, x, x, NULL, &weights);
    ag_tensor *loss = ag_mse(tp, out, target);
    ag_tensor_set_name(loss, "loss");
    bool named = name_nodes(tp, &m), bk_ok = false;
    ag_node *k_proj = projection(tp, &m, 1);
    const ag_tensor *key_bias = k_proj && k_proj->n_in > 2 ? k_proj->in[2] : NULL;
    if (!named)
        printf("backprop_walkthrough: the nodes of ag_mha_forward are not the ones this "
               "walkthrough names (linear q, k, v; split_heads; matmul; softmax; matmul; "
               "merge_heads; linear; mse)\n");
    int n = ag_tape_num_nodes(tp);

    printf("The tape, with each node's backward rule (ag_tape_print_verbose):\n");
    ag_tape_print_verbose(tp, stdout);
    printf("\nForward, node by node (loss = mean((out - target)^2)):\n");
    show("x", x, false);
    for (int i = 0; i < n; i++) {
        ag_node *nd = ag_tape_node(tp, i);
        char buf[64];
        printf("  #%d %s(", i, nd->op->name);
        for (int k = 0; k < nd->n_in; k++)
            printf("%s%s", k ? ", " : "", name_of(nd->in[k], buf, sizeof buf));
        printf(")\n");
        show(name_of(nd->out, buf, sizeof buf), nd->out, false);
    }

    // The reference: ag_backward. Then the same walk by hand, node by node, to see it.
    ag_backward(tp, loss);
    int np = ag_params_count(ps);
    double *ref_x = copy_grad(x), *ref_p[16];
    for (int p = 0; p < np && p < 16; p++) ref_p[p] = copy_grad(ag_params_at(ps, p));

    // Each node checked on its own (before the hand walk: the check leaves the tape alone).
    ag_tape_check_report r;
    bool ok = ag_tape_check(tp, NULL, &r);

    ag_tensor_zero_grad(x);
    ag_params_zero_grad(ps);
    for (int i = 0; i < n; i++) ag_tensor_zero_grad(ag_tape_node(tp, i)->out);
    ag_tensor seed = ag_tensor_grad_view(loss);
    ag_tensor_set_item(&seed, 0, 1.0);  // d loss / d loss = 1

    printf("\nBackward, node by node, last to first (this loop is the heart of ag_backward):\n");
    for (int i = n - 1; i >= 0; i--) {
        ag_node *nd = ag_tape_node(tp, i);
        char buf[64], label[96];
        printf("  #%d %s    rule: %s\n", i, nd->op->name, nd->op->rule ? nd->op->rule : "-");
        snprintf(label, sizeof label, "upstream d(%s)", name_of(nd->out, buf, sizeof buf));
        show(label, nd->out, true);
        double *before[AG_MAX_INPUTS] = {0};
        for (int k = 0; k < nd->n_in; k++)
            if (nd->in[k]->requires_grad) before[k] = copy_grad(nd->in[k]);
        nd->op->backward(nd);  // accumulates (+=) into each input's gradient
        for (int k = 0; k < nd->n_in; k++) {
            if (!before[k]) continue;
            ag_tensor *in = nd->in[k];
            ag_tensor *delta = ag_tensor_zeros(AG_F64, in->ndim, in->shape);
            for (size_t e = 0; e < in->numel; e++)
                ag_tensor_set_item(delta, e, ag_tensor_grad_item(in, e) - before[k][e]);
            double rounding = in == key_bias ? rounding_to_zero(delta, nd->out) : 0;
            snprintf(label, sizeof label, "sends d(%s)", name_of(in, buf, sizeof buf));
            show(label, delta, false);
            if (in == key_bias) {
                printf("    the key bias's gradient is exactly 0, as in Part 1 (softmax is "
                       "shift-invariant);\n    float64 left rounding of at most %.1g\n",
                       rounding);
                bk_ok = rounding >= 0;
            }
            ag_tensor_free(delta);
            free(before[k]);
        }
        print_check(&r.nodes[i]);
    }
    printf("\nx is used three times (query, key and value), so its gradient is the sum of\n"
           "what the three projections sent it:\n");
    show("d loss / d x", x, true);

    double worst = 0;
    for (size_t e = 0; e < x->numel; e++)
        worst = fmax(worst, fabs(ag_tensor_grad_item(x, e) - ref_x[e]));
    for (int p = 0; p < np && p < 16; p++) {
        ag_tensor *t = ag_params_at(ps, p);
        for (size_t e = 0; e < t->numel; e++)
            worst = fmax(worst, fabs(ag_tensor_grad_item(t, e) - ref_p[p][e]));
        free(ref_p[p]);
    }
    free(ref_x);
    printf("the hand walk and ag_backward agree: largest difference %g\n", worst);

    printf("\nThe whole check (ag_tape_check_print):\n");
    ag_tape_check_print(&r, stdout);

    // The key bias's rows of in_proj_bias's gradient hold the rounding printed above: the
    // graphs show the 0 it is.
    if (key_bias) {
        ag_tensor bk_grad = ag_tensor_grad_view(key_bias);
        bk_ok = rounding_to_zero(&bk_grad, k_proj->out) >= 0 && bk_ok;
    }
    const ag_tape_html_note notes[] = {
        {key_bias, "The key bias's gradient is exactly 0 (softmax is shift-invariant: see the "
                   "worked example). float64 leaves rounding of about 1e-19 here; it is shown "
                   "as the 0 it is."},
        {x, "x is the query, the key and the value: three projections read it, and its "
            "gradient is the sum of what they send."},
    };
    ok = write_graph(tp, graph) && ok;
    ok = write_page(tp, graph, "attention backward: torch.nn.MultiheadAttention, 2 heads", &r,
                    notes, 2) && ok;
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    ag_params_free(ps);
    ag_tensor_free(x), ag_tensor_free(target);
    if (!bk_ok)
        printf("backprop_walkthrough: the key bias's gradient is not within rounding of 0\n");
    return ok && named && bk_ok && worst == 0;
}

int main(int argc, char **argv) {
    // The attention graph goes to OUT.dot, the worked example's to OUT_notes.dot.
    const char *dot_path = "backprop_walkthrough.dot";
    flag flags[] = {FLAG("OUT.dot", STRING, &dot_path, 0, 0, false, "the graph to write; also "
                         "writes OUT.html, OUT_notes.dot and OUT_notes.html, and the .dot files "
                         "as SVG when Graphviz is installed")};
    ag_err err;
    flags_result parsed =
        flags_parse("usage: backprop_walkthrough [OUT.dot]", flags, 1, argc, argv, &err);
    if (parsed == FLAGS_HELP) return 0;
    if (parsed == FLAGS_BAD) {
        fprintf(stderr, "backprop_walkthrough: %s\n", err.msg);
        return 2;
    }
    char notes_path[1024];
    if (!path_beside(notes_path, sizeof notes_path, dot_path, ".dot", "_notes.dot")) {
        fprintf(stderr, "backprop_walkthrough: the path %s is too long\n", dot_path);
        return 1;
    }
    graph_file notes, attention;
    if (!open_graph(&notes, notes_path) || !open_graph(&attention, dot_path)) return 1;
    bool ok = worked_example(&notes);
    ok = tiny_mha(&attention) && ok;
    printf("\n%s\n", ok ? "walkthrough: every node passed its check" : "walkthrough: FAILED");
    return ok ? 0 : 1;
}
