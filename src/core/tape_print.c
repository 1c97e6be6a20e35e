// Seeing the tape: a text listing and a Graphviz DOT graph, for debugging and
// for teaching backpropagation.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static double norm(const ag_tensor *t, const void *buf) {
    if (!buf) return NAN;
    ag_tensor view = *t;
    view.data = (void *)buf;
    double s = 0;
    for (size_t i = 0; i < t->numel; i++) {
        double v = ag_tensor_item(&view, i);
        s += v * v;
    }
    return sqrt(s);
}

// An op of one's own may leave its name NULL (ag_op_apply names it "op_apply" then).
static const char *op_name(const ag_op *op) { return op->name ? op->name : "?"; }

static void tensor_label(const ag_tensor *t, FILE *f) {
    if (t->name) {
        agi_fput_escaped(t->name, f);
        fputc(' ', f);
    }
    fprintf(f, "%s %s", ag_dtype_name(t->dtype), agi_shape(t));
}

// A NULL tape or stream is reported in the caller's name, and nothing is written.
static bool can_print(const ag_tape *tp, FILE *f, const char *fn) {
    return agi_given(tp, fn, "tape") && agi_given(f, fn, "stream");
}

static void print_listing(const ag_tape *tp, FILE *f, bool rules) {
    if (!can_print(tp, f, rules ? "tape_print_verbose" : "tape_print")) return;
    int n = ag_tape_num_nodes(tp);
    fprintf(f, "tape: %d node%s\n", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        const ag_node *nd = ag_tape_node(tp, i);
        fprintf(f, "  #%-3d %-14s ", i, op_name(nd->op));
        for (int k = 0; k < nd->n_in; k++) {
            const ag_tensor *x = nd->in[k];
            if (k) fputs(", ", f);
            if (x->node) fprintf(f, "#%d:", x->node->index);
            tensor_label(x, f);
        }
        fputs(" -> ", f);
        tensor_label(nd->out, f);
        if (nd->out->grad) fprintf(f, "  |grad| %.4e", norm(nd->out, nd->out->grad));
        if (nd->forward_seconds > 0 || nd->backward_seconds > 0)
            fprintf(f, "  fwd %.3f ms bwd %.3f ms", 1e3 * nd->forward_seconds,
                    1e3 * nd->backward_seconds);
        fputs("\n", f);
        if (rules) fprintf(f, "        rule: %s\n", nd->op->rule ? nd->op->rule : "(none given)");
    }
}

void ag_tape_print(const ag_tape *tp, FILE *f) { print_listing(tp, f, false); }

void ag_tape_print_verbose(const ag_tape *tp, FILE *f) { print_listing(tp, f, true); }

typedef struct {
    const char *name;
    int calls;
    double fwd, bwd;
} op_time;

static int slower_first(const void *a, const void *b) {
    double ta = ((const op_time *)a)->fwd + ((const op_time *)a)->bwd;
    double tb = ((const op_time *)b)->fwd + ((const op_time *)b)->bwd;
    return (ta < tb) - (ta > tb);
}

void ag_tape_profile_print(const ag_tape *tp, FILE *f) {
    if (!can_print(tp, f, "tape_profile_print")) return;
    enum { MAX_OPS = 64 };
    op_time ops[MAX_OPS];
    int n_ops = 0;
    double total = 0;
    for (int i = 0; i < ag_tape_num_nodes(tp); i++) {
        const ag_node *nd = ag_tape_node(tp, i);
        int k = 0;
        while (k < n_ops && strcmp(ops[k].name, op_name(nd->op)) != 0) k++;
        if (k == n_ops) {
            if (n_ops == MAX_OPS) continue;  // more distinct ops than a table is useful for
            ops[n_ops++] = (op_time){op_name(nd->op), 0, 0, 0};
        }
        ops[k].calls++;
        ops[k].fwd += nd->forward_seconds;
        ops[k].bwd += nd->backward_seconds;
        total += nd->forward_seconds + nd->backward_seconds;
    }
    qsort(ops, (size_t)n_ops, sizeof *ops, slower_first);
    fprintf(f, "%-16s %6s %10s %10s %7s\n", "op", "calls", "fwd ms", "bwd ms", "share");
    for (int k = 0; k < n_ops; k++)
        fprintf(f, "%-16s %6d %10.3f %10.3f %6.1f%%\n", ops[k].name, ops[k].calls,
                1e3 * ops[k].fwd, 1e3 * ops[k].bwd,
                total > 0 ? 100 * (ops[k].fwd + ops[k].bwd) / total : 0.0);
    fprintf(f, "%-16s %6d %21.3f ms in all\n", "total", ag_tape_num_nodes(tp), 1e3 * total);
}

// ---- Graphviz DOT ------------------------------------------------------------------------
// Top to bottom, so that a graph is as wide as its widest layer, not as long as the tape.
// One box per op, holding its rule and the leaves only it reads (a weight, a bias); one box
// per op output, and per leaf that several ops read (an input used as query, key and
// value). Lines are left-justified ("\l") and short: three values a line, the norm on the
// next, so that three boxes side by side stay within a page's width.

// Text inside a quoted DOT label: quotes and backslashes escaped, and a rule's parts
// ("dx = ...; dW = ...") one per line, so a long rule stays readable.
static void dot_text(const char *s, FILE *f) {
    for (; *s; s++) {
        if (s[0] == ';' && s[1] == ' ') {
            fputs("\\l", f);
            s++;
        } else if (*s == '"' || *s == '\\') {
            fputc('\\', f);
            fputc(*s, f);
        } else {
            fputc(*s, f);
        }
    }
}

static void dot_tensor_line(const ag_tensor *t, FILE *f) {
    if (t->name) {
        dot_text(t->name, f);
        fputc(' ', f);
    } else if (t->node) {
        fprintf(f, "#%d ", t->node->index);
        dot_text(op_name(t->node->op), f);
        fputc(' ', f);
    }
    fprintf(f, "%s %s\\l", ag_dtype_name(t->dtype), agi_shape(t));
}

// Up to 3 entries of a buffer and, for more than one, its norm on a line of its own.
static void dot_values(const ag_tensor *t, const void *buf, const char *what, FILE *f) {
    ag_tensor view = *t;
    view.data = (void *)buf;
    fprintf(f, "%-6s", what);
    size_t n = t->numel < 3 ? t->numel : 3;
    char s[32];  // '.' whatever the locale: the graph is a file, the same bytes every run
    for (size_t i = 0; i < n; i++) {
        agi_format_g(s, sizeof s, 4, ag_tensor_item(&view, i));
        fprintf(f, " %s", s);
    }
    if (t->numel > n) fputs(" ...", f);
    fputs("\\l", f);
    if (t->numel > 1) {
        agi_format_g(s, sizeof s, 4, norm(t, buf));
        fprintf(f, "       norm %s\\l", s);
    }
}

// A tensor's lines: name, dtype and shape; a few values; a few gradient entries.
static void dot_tensor_lines(const ag_tensor *t, FILE *f) {
    dot_tensor_line(t, f);
    if (agi_is_float(t->dtype)) dot_values(t, t->data, "value", f);
    if (t->grad) dot_values(t, t->grad, "grad", f);
}

// A tensor's name in the graph, the same at every run (so that a committed drawing changes
// only when the tape does): "y3" for node 3's output, "x3_1" for a leaf first read as input
// 1 of node 3.
static void dot_id(const ag_tape *tp, const ag_tensor *t, char *buf, size_t size) {
    if (t->node && t->node->tape == tp) {
        snprintf(buf, size, "y%d", t->node->index);
        return;
    }
    t = agi_tape_leaf(tp, t);
    for (int j = 0; j < ag_tape_num_nodes(tp); j++)
        for (int m = 0; m < ag_tape_node(tp, j)->n_in; m++)
            if (agi_tape_leaf(tp, ag_tape_node(tp, j)->in[m]) == t) {
                snprintf(buf, size, "x%d_%d", j, m);
                return;
            }
    snprintf(buf, size, "x");
}

static void dot_tensor(const ag_tape *tp, const ag_tensor *t, FILE *f) {
    char id[32];
    dot_id(tp, t, id, sizeof id);
    fprintf(f, "  \"%s\" [shape=box, style=%s, label=\"", id,
            t->node ? "solid" : "filled, fillcolor=\"#eef4ff\"");
    dot_tensor_lines(t, f);
    fputs("\"];\n", f);
}

static int by_address(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)*(const ag_tensor *const *)a;
    uintptr_t y = (uintptr_t)*(const ag_tensor *const *)b;
    return (x > y) - (x < y);
}

// How many times the tape reads leaf t: `reads` holds every leaf input (as agi_tape_leaf
// gives it), sorted.
static size_t reads_of(const ag_tape *tp, const ag_tensor *t, const ag_tensor **reads,
                       size_t n) {
    t = agi_tape_leaf(tp, t);
    const ag_tensor **hit = bsearch(&t, reads, n, sizeof *reads, by_address);
    if (!hit) return 0;
    const ag_tensor **lo = hit, **hi = hit;
    while (lo > reads && lo[-1] == t) lo--;
    while (hi + 1 < reads + n && hi[1] == t) hi++;
    return (size_t)(hi - lo) + 1;
}

void ag_tape_dot(const ag_tape *tp, FILE *f) {
    if (!can_print(tp, f, "tape_dot")) return;
    fputs("digraph attograd {\n  rankdir=TB;\n  nodesep=0.2;\n  ranksep=0.3;\n"
          "  node [fontname=\"monospace\", fontsize=10];\n", f);
    int n = ag_tape_num_nodes(tp);
    size_t n_reads = 0;
    for (int i = 0; i < n; i++) n_reads += (size_t)ag_tape_node(tp, i)->n_in;
    const ag_tensor **reads = malloc((n_reads ? n_reads : 1) * sizeof *reads);
    if (!reads) return;
    n_reads = 0;
    for (int i = 0; i < n; i++) {
        const ag_node *nd = ag_tape_node(tp, i);
        for (int k = 0; k < nd->n_in; k++)
            if (!nd->in[k]->node) reads[n_reads++] = agi_tape_leaf(tp, nd->in[k]);
    }
    qsort(reads, n_reads, sizeof *reads, by_address);
    for (int i = 0; i < n; i++) {
        const ag_node *nd = ag_tape_node(tp, i);
        fprintf(f, "  \"n%d\" [shape=box, style=\"rounded,filled\", fillcolor=\"#f4f6fa\", "
                   "label=\"#%d ", i, i);
        dot_text(op_name(nd->op), f);
        fputs("\\l", f);
        if (nd->op->rule) {
            dot_text(nd->op->rule, f);
            fputs("\\l", f);
        }
        for (int k = 0; k < nd->n_in; k++) {  // the leaves only this op reads
            const ag_tensor *x = nd->in[k];
            if (x->node || reads_of(tp, x, reads, n_reads) > 1) continue;
            fprintf(f, "input %d: ", k);
            dot_tensor_lines(x, f);
        }
        fputs("\"];\n", f);
        for (int k = 0; k < nd->n_in; k++) {
            const ag_tensor *x = nd->in[k];
            if (!x->node && reads_of(tp, x, reads, n_reads) == 1) continue;
            char id[32];
            dot_id(tp, x, id, sizeof id);
            // A shared leaf is drawn where it is first read: there its id names this read.
            char here[32];
            snprintf(here, sizeof here, "x%d_%d", i, k);
            if (!x->node && !strcmp(id, here)) dot_tensor(tp, x, f);
            fprintf(f, "  \"%s\" -> \"n%d\";\n", id, i);
        }
        dot_tensor(tp, nd->out, f);
        fprintf(f, "  \"n%d\" -> \"y%d\";\n", i, i);
    }
    free(reads);
    fputs("}\n", f);
}
