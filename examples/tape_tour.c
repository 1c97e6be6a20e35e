// A tour of the tape, for learning backpropagation: a tiny attention-flavoured
// computation, its tape with each node's backward rule, the gradients backward
// leaves, a gradient check, the same check node by node, and the graph as Graphviz
// DOT with values and gradients on every tensor and the rule on every op.
//
//     ./build/examples/tape_tour [out.dot]     then: dot -Tsvg out.dot > tape.svg
#include <attograd.h>

// loss = mean(softmax(x W^T + b) * y), rows of x scored against targets y.
static ag_tensor *model(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n, (void)user;
    ag_tensor *x = in[0], *w = in[1], *b = in[2], *y = in[3];
    ag_tensor *scores = ag_linear(tp, x, w, b);  // [2, 3]
    ag_tensor *probs = ag_softmax(tp, scores, NULL);
    return ag_mean(tp, ag_mul(tp, probs, y));
}

int main(int argc, char **argv) {
    ag_pcg32 rng = ag_pcg32_make(7, 1);
    ag_tensor *x = ag_tensor_uniform(AG_F64, 2, (int[]){2, 4}, &rng, -1, 1);
    ag_tensor *w = ag_tensor_uniform(AG_F64, 2, (int[]){3, 4}, &rng, -1, 1);  // [out, in]
    ag_tensor *b = ag_tensor_zeros(AG_F64, 1, (int[]){3});
    ag_tensor *y = ag_tensor_from(AG_F64, 2, (int[]){2, 3}, (double[]){1, 0, 0, 0, 0, 1});
    ag_tensor_set_name(x, "x"), ag_tensor_set_name(w, "W"), ag_tensor_set_name(b, "b");
    ag_tensor_set_name(y, "y");
    ag_tensor_set_requires_grad(w, true);
    ag_tensor_set_requires_grad(b, true);

    ag_tape *tp = ag_tape_new();
    ag_tensor *inputs[] = {x, w, b, y};
    ag_tensor *loss = model(tp, inputs, 4, NULL);
    ag_tensor_set_name(loss, "loss");
    ag_backward(tp, loss);  // walks the tape in reverse, accumulating into .grad

    ag_tape_print_verbose(tp, stdout);  // each node with its backward rule
    printf("\nloss = %.6f\n", ag_tensor_get(loss, 0));
    for (int i = 1; i <= 2; i++) {
        ag_tensor view = ag_tensor_grad_view(inputs[i]);  // a gradient as a tensor of its own
        printf("d loss / d %s: ", inputs[i]->name);
        ag_tensor_print(&view, stdout);
    }

    ag_gradcheck_result r;
    ag_gradcheck(model, inputs, 4, NULL, NULL, &r);
    printf("\ngradcheck: %s (%zu elements, max abs error %.1e)\n", r.ok ? "ok" : "FAILED",
           r.checked, r.max_abs_err);
    // The same check node by node: which node would be wrong, if one were.
    ag_tape_check_report tc;
    bool nodes_ok = ag_tape_check(tp, NULL, &tc);
    ag_tape_check_print(&tc, stdout);
    ag_tape_check_report_free(&tc);

    const char *path = argc > 1 ? argv[1] : "tape.dot";
    FILE *f = fopen(path, "w");
    if (f) {
        ag_tape_dot(tp, f);
        fclose(f);
        printf("wrote %s (render: dot -Tsvg %s > tape.svg)\n", path, path);
    }
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(w), ag_tensor_free(b), ag_tensor_free(y);
    return r.ok && nodes_ok ? 0 : 1;
}
