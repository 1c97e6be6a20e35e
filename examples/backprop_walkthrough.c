// backprop_walkthrough: attention's backward, node by node, for people learning
// backpropagation.
//
// Part 1 redoes the worked example of the multi-head attention notes (a 4x4 score
// matrix, scaled by 1/sqrt(64) = 1/8, softmax row by row, weighted sum) and walks its
// backward. Part 2 runs a tiny torch.nn.MultiheadAttention (4 tokens, E = 8, 2 heads)
// forward node by node, then its backward node by node: for each node its rule, the
// gradient arriving from above, the gradients it sends to its inputs, and a finite-
// difference check of that node alone (ag_tape_check). Last it writes the graph, with
// values and gradients, as Graphviz DOT, and renders it to SVG when `dot` is installed.
//
//     ./build/examples/backprop_walkthrough [out.dot]
//
// writes out.dot (the attention) and out_notes.dot (the worked example), and their SVGs.
//
// Exit status 0 when every node passes its check, the nodes carry their names and the
// hand-run backward gives exactly ag_backward's gradients; 1 when one of these fails or a
// graph cannot be written; 2 for a bad command line.
#include <attograd.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- Printing every entry of a small tensor ------------------------------------------------

// A tensor (or its gradient) as matrices over its last two dims, every entry shown.
static void show(const char *label, const ag_tensor *t, bool grad) {
    char sh[64];
    ag_shape_str(t, sh, sizeof sh);
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
                printf(" %8.4f", ag_tensor_get(&view, (m * (size_t)rows + (size_t)r) * cols + c));
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

// A graph file, opened before any work so that a path that cannot be written stops the
// program at once, with one line.
typedef struct {
    FILE *f;
    const char *path;
} graph_file;

static bool open_graph(graph_file *g, const char *path) {
    g->path = path;
    g->f = fopen(path, "w");
    if (!g->f)
        fprintf(stderr, "backprop_walkthrough: cannot write %s: %s\n", path, strerror(errno));
    return g->f != NULL;
}

// Writes the tape as DOT to g (and closes it) and, when Graphviz is installed, renders it
// to the same path with .svg for .dot. Returns false if either step failed.
static bool write_graph(const ag_tape *tp, graph_file *g) {
    const char *dot_path = g->path;
    ag_tape_dot(tp, g->f);
    bool failed = ferror(g->f) != 0;
    if (fclose(g->f) != 0 || failed) {
        fprintf(stderr, "backprop_walkthrough: cannot write %s: %s\n", dot_path,
                errno ? strerror(errno) : "write error");
        return false;
    }
    printf("wrote %s (every tensor with its values and gradient, every op with its rule)\n",
           dot_path);
    char svg[1024], cmd[2200];
    size_t len = strlen(dot_path);
    if (len > 4 && strcmp(dot_path + len - 4, ".dot") == 0) len -= 4;
    snprintf(svg, sizeof svg, "%.*s.svg", (int)len, dot_path);
    if (system("command -v dot > /dev/null 2>&1") != 0) {
        printf("Graphviz dot is not installed: skipping the rendering "
               "(apt-get install graphviz)\n");
        return true;
    }
    snprintf(cmd, sizeof cmd, "dot -Tsvg '%s' -o '%s'", dot_path, svg);
    if (system(cmd) != 0) {
        fprintf(stderr, "backprop_walkthrough: dot failed on %s\n", dot_path);
        return false;
    }
    printf("rendered %s\n", svg);
    return true;
}

// ---- Part 1: the worked example of the notes -------------------------------------------------

// S_1 = Q_1 K_1^T and the softmax A_1 as the notes print them ("Step-by-Step Computation").
static const double notes_scores[16] = {20.5, 15.2, 8.3,  12.1, 16.8, 22.3, 10.5, 14.2,
                                        9.2,  11.5, 19.8, 7.6,  13.4, 15.1, 9.9,  21.2};
static const double notes_softmax[16] = {0.48, 0.25, 0.10, 0.17, 0.18, 0.51, 0.10, 0.21,
                                         0.12, 0.16, 0.62, 0.10, 0.16, 0.19, 0.10, 0.55};

static bool worked_example(graph_file *graph) {
    heading("Part 1: the worked example (4 tokens, d_k = 64, one head)");
    ag_tape *tp = ag_tape_new();
    ag_tensor *S = ag_tensor_from(AG_F64, 2, (int[]){4, 4}, notes_scores);
    // The notes give no V; any 4 x d will do. Two columns keep it readable.
    ag_tensor *V = ag_tensor_from(AG_F64, 2, (int[]){4, 2},
                                  (double[]){1, 0, 0, 1, 2, 1, -1, 3});
    ag_tensor_set_name(S, "S"), ag_tensor_set_name(V, "V");
    ag_tensor_set_requires_grad(S, true), ag_tensor_set_requires_grad(V, true);

    ag_tensor *Ss = ag_scale(tp, S, 1.0 / sqrt(64.0));
    ag_tensor *A = ag_softmax(tp, Ss, NULL);
    ag_tensor *O = ag_matmul(tp, A, V, false, false);
    ag_tensor_set_name(Ss, "S/8"), ag_tensor_set_name(A, "A"), ag_tensor_set_name(O, "O");

    printf("Forward:\n");
    show("S = Q K^T (from the notes)", S, false);
    show("S/8 = S / sqrt(64)", Ss, false);
    const double *s8 = Ss->data, *a = A->data;
    printf("    row 0: exp(S/8) =");
    double sum = 0;
    for (int j = 0; j < 4; j++) {
        printf(" %.4f", exp(s8[j]));
        sum += exp(s8[j]);
    }
    printf(", sum %.4f (the notes: 12.94 6.69 2.83 4.53, sum 26.99: they rounded S/8 first)\n",
           sum);
    show("A = softmax(S/8), row by row", A, false);
    printf("    against the notes' A_1 (printed to 2 decimals):\n");
    int wrong = 0;
    for (int i = 0; i < 4; i++) {
        double worst = 0;
        for (int j = 0; j < 4; j++)
            worst = fmax(worst, fabs(a[4 * i + j] - notes_softmax[4 * i + j]));
        bool agrees = worst <= 0.005 + 1e-12;
        wrong += !agrees;
        printf("      row %d  notes:", i);
        for (int j = 0; j < 4; j++) printf(" %.2f", notes_softmax[4 * i + j]);
        printf("   correct:");
        for (int j = 0; j < 4; j++) printf(" %.4f", a[4 * i + j]);
        printf("   %s\n", agrees ? "agrees" : "WRONG in the notes");
    }
    printf("    %d of 4 rows of the notes' softmax are wrong; the values above are the right ones\n"
           "    (torch.softmax(S / 8, dim=1) gives the same).\n",
           wrong);
    show("V (chosen here: the notes give none)", V, false);
    show("O = A V", O, false);

    // loss = O[0][0]: how the first output feature of token 0 depends on everything.
    ag_tensor *dO = ag_tensor_from(AG_F64, 2, (int[]){4, 2}, (double[]){1, 0, 0, 0, 0, 0, 0, 0});
    ag_backward_with(tp, O, dO);
    printf("\nBackward from loss = O[0][0] (upstream dO = 1 at [0][0], 0 elsewhere):\n");
    for (int i = ag_tape_num_nodes(tp) - 1; i >= 0; i--) {
        ag_node *nd = ag_tape_node(tp, i);
        printf("  #%d %s    rule: %s\n", i, nd->op->name, nd->op->rule);
        char buf[64];
        char label[96];
        snprintf(label, sizeof label, "upstream d%s", name_of(nd->out, buf, sizeof buf));
        show(label, nd->out, true);
        for (int k = 0; k < nd->n_in; k++) {
            if (!nd->in[k]->requires_grad) continue;
            snprintf(label, sizeof label, "sends d%s", name_of(nd->in[k], buf, sizeof buf));
            show(label, nd->in[k], true);
        }
    }
    // The softmax rule by hand, row 0: dx_j = y_j (dy_j - sum_k dy_k y_k), with dy = V[:,0]
    // and sum_k dy_k y_k = O[0][0]: a score gains where its value beats the average.
    const double *v = V->data, *o = O->data, *g = Ss->grad;
    printf("  by hand, row 0 of d(S/8) = A[0][j] * (V[j][0] - O[0][0]):");
    double worst = 0;
    for (int j = 0; j < 4; j++) {
        double hand = a[j] * (v[2 * j] - o[0]);
        printf(" %.4f", hand);
        worst = fmax(worst, fabs(hand - g[j]));
    }
    printf("   (tape: max difference %.1e)\n", worst);
    printf("  V and, under it, its gradient (ag_tensor_print_grad): column 0 is A's row 0\n");
    ag_tensor_print_grad(V, stdout);

    ag_tape_check_report r;
    bool ok = ag_tape_check(tp, NULL, &r);
    printf("\nEach node checked on its own by finite differences (ag_tape_check):\n");
    ag_tape_check_print(&r, stdout);
    ag_tape_check_report_free(&r);
    ok = write_graph(tp, graph) && ok;
    ag_tape_free(tp);
    ag_tensor_free(S), ag_tensor_free(V), ag_tensor_free(dO);
    return ok && worst < 1e-15;
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
    for (size_t i = 0; i < t->numel; i++) g[i] = ag_tensor_grad_get(t, i);
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
    if (!ag_mha_init(&m, ps, "attn.", &cfg, &rng)) {
        ag_params_free(ps);
        fclose(graph->f);
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
    bool named = name_nodes(tp, &m);
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
    ag_tensor_set(&seed, 0, 1.0);  // d loss / d loss = 1

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
                ag_tensor_set(delta, e, ag_tensor_grad_get(in, e) - before[k][e]);
            snprintf(label, sizeof label, "sends d(%s)", name_of(in, buf, sizeof buf));
            show(label, delta, false);
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
        worst = fmax(worst, fabs(ag_tensor_grad_get(x, e) - ref_x[e]));
    for (int p = 0; p < np && p < 16; p++) {
        ag_tensor *t = ag_params_at(ps, p);
        for (size_t e = 0; e < t->numel; e++)
            worst = fmax(worst, fabs(ag_tensor_grad_get(t, e) - ref_p[p][e]));
        free(ref_p[p]);
    }
    free(ref_x);
    printf("the hand walk and ag_backward agree: largest difference %g\n", worst);

    printf("\nThe whole check (ag_tape_check_print):\n");
    ag_tape_check_print(&r, stdout);
    ag_tape_check_report_free(&r);

    ok = write_graph(tp, graph) && ok;
    ag_tape_free(tp);
    ag_params_free(ps);
    ag_tensor_free(x), ag_tensor_free(target);
    return ok && named && worst == 0;
}

int main(int argc, char **argv) {
    // The attention graph goes to out.dot, the worked example's to out_notes.dot.
    const char *dot_path = argc > 1 ? argv[1] : "backprop_walkthrough.dot";
    const char *usage = "usage: backprop_walkthrough [OUT.dot]";
    if (argc == 2 && (!strcmp(dot_path, "--help") || !strcmp(dot_path, "-h"))) {
        printf("%s   (default backprop_walkthrough.dot; also writes OUT_notes.dot, and both "
               "as SVG when Graphviz is installed)\n", usage);
        return 0;
    }
    if (argc > 2 || dot_path[0] == '-' || !dot_path[0]) {
        if (argc > 2)
            fprintf(stderr, "backprop_walkthrough: one argument at most, got %d (%s)\n",
                    argc - 1, usage);
        else if (dot_path[0])
            fprintf(stderr, "backprop_walkthrough: unknown option %s (%s)\n", dot_path, usage);
        else
            fprintf(stderr, "backprop_walkthrough: the output path is empty (%s)\n", usage);
        return 2;
    }
    char notes_path[1024];
    size_t len = strlen(dot_path);
    if (len > 4 && strcmp(dot_path + len - 4, ".dot") == 0) len -= 4;
    snprintf(notes_path, sizeof notes_path, "%.*s_notes.dot", (int)len, dot_path);
    graph_file notes, attention;
    if (!open_graph(&notes, notes_path)) return 1;
    if (!open_graph(&attention, dot_path)) {
        fclose(notes.f);
        return 1;
    }
    bool ok = worked_example(&notes);
    ok = tiny_mha(&attention) && ok;
    printf("\n%s\n", ok ? "walkthrough: every node passed its check" : "walkthrough: FAILED");
    return ok ? 0 : 1;
}
