// A tour of the tape, for learning backpropagation: a tiny attention-flavoured
// computation, its tape with each node's backward rule, the gradients backward
// leaves, a gradient check, the same check node by node, and the graph twice: as
// Graphviz DOT with values and gradients on every tensor and the rule on every op, and
// as a web page (ag_tape_html) to step through forward and backward.
//
//     ./build/examples/tape_tour [out.dot]     then: dot -Tsvg out.dot > tape.svg,
//                                              and open out.html in a browser
//
// Exit status 0 when the gradient check and every node's check pass; 1 when one fails or
// the .dot or the page cannot be written; 2 for a bad command line.
#include <attograd.h>
#include <string.h>

#include "common/flags.h"
#include "common/path.h"
#include "common/staged_file.h"

// loss = mean(softmax(x W^T + b) * y), rows of x scored against targets y.
static ag_tensor *model(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    (void)user;
    ag_tensor *x = in[0], *w = in[1], *b = in[2], *y = in[3];
    ag_tensor *scores = ag_linear(tp, x, w, b);  // [2, 3]
    ag_tensor *probs = ag_softmax(tp, scores, NULL);
    return ag_mean(tp, ag_mul(tp, probs, y));
}

// Writes the tape as DOT to `path`, whole or not at all (an earlier run's .dot stays as it
// was when this one cannot be written); one line on stderr and false when it cannot.
static bool write_dot(const ag_tape *tp, const char *path) {
    staged_file out;
    ag_err err;
    FILE *f = staged_open(&out, path, &err);
    if (f) ag_tape_dot(tp, f);
    if (!f || !staged_commit(&out, path, &err)) {
        fprintf(stderr, "tape_tour: cannot write %s: %s\n", path, err.msg);
        return false;
    }
    printf("wrote %s (render: dot -Tsvg %s > tape.svg)\n", path, path);
    return true;
}

// Writes the tape's web page beside the .dot (.html for .dot), with each node's check.
static bool write_page(const ag_tape *tp, const char *dot_path,
                       const ag_tape_check_report *check) {
    char html[1024];
    if (!path_beside(html, sizeof html, dot_path, ".dot", ".html")) {
        fprintf(stderr, "tape_tour: the path %s is too long\n", dot_path);
        return false;
    }
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.title = "tape_tour: mean(softmax(x W^T + b) * y)";
    o.check = check;
    ag_err err;
    if (ag_tape_html(tp, html, &o, &err)) {
        fprintf(stderr, "tape_tour: %s\n", err.msg);
        return false;
    }
    printf("wrote %s (open it in a browser)\n", html);
    return true;
}

int main(int argc, char **argv) {
    // One optional argument, the .dot to write: anything else is a mistake, and said so.
    const char *path = "tape.dot";
    flag flags[] = {FLAG("OUT.dot", STRING, &path, 0, 0, false, "the graph to write (render "
                         "it with dot -Tsvg OUT.dot); also writes OUT.html, the tape as a web "
                         "page")};
    ag_err err;
    flags_result parsed = flags_parse("usage: tape_tour [OUT.dot]", flags, 1, argc, argv, &err);
    if (parsed == FLAGS_HELP) return 0;
    if (parsed == FLAGS_BAD) {
        fprintf(stderr, "tape_tour: %s\n", err.msg);
        return 2;
    }
    ag_pcg32 rng = ag_pcg32_make(7, 1);
    ag_tensor *x = ag_tensor_uniform(AG_F64, 2, (int[]){2, 4}, &rng, -1, 1);
    ag_tensor *w = ag_tensor_uniform(AG_F64, 2, (int[]){3, 4}, &rng, -1, 1);  // [out, in]
    ag_tensor *b = ag_tensor_zeros(AG_F64, 1, (int[]){3});
    ag_tensor *y = ag_tensor_from(AG_F64, 2, (int[]){2, 3}, (double[]){1, 0, 0, 0, 0, 1});
    ag_tensor_set_name(x, "x");
    ag_tensor_set_name(w, "W");
    ag_tensor_set_name(b, "b");
    ag_tensor_set_name(y, "y");
    ag_tensor_set_requires_grad(w, true);
    ag_tensor_set_requires_grad(b, true);

    ag_tape *tp = ag_tape_new();
    ag_tensor *inputs[] = {x, w, b, y};
    ag_tensor *loss = model(tp, inputs, 4, NULL);
    ag_tensor_set_name(loss, "loss");
    ag_backward(tp, loss);  // walks the tape in reverse, accumulating into .grad

    ag_tape_print_verbose(tp, stdout);  // each node with its backward rule
    printf("\nloss = %.6f\n", ag_tensor_item(loss, 0));
    for (int i = 1; i <= 2; i++) {
        printf("\n");
        ag_tensor_print_grad(inputs[i], stdout);  // the values, then d loss / d them
    }

    ag_gradcheck_result r;
    bool grad_ok = ag_gradcheck(model, inputs, 4, NULL, NULL, &r);
    printf("\ngradcheck: %s (%zu elements, max abs error %.1e)\n",
           ag_check_verdict_name(r.verdict), r.checked, r.fd.max_abs_err);
    // The same check node by node: which node would be wrong, if one were.
    ag_tape_check_report tc;
    bool nodes_ok = ag_tape_check(tp, NULL, &tc);
    ag_tape_check_print(&tc, stdout);

    bool wrote = write_dot(tp, path) && write_page(tp, path, &tc);
    ag_tape_check_report_free(&tc);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(w);
    ag_tensor_free(b);
    ag_tensor_free(y);
    return grad_ok && nodes_ok && wrote ? 0 : 1;
}
