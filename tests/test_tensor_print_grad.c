// ag_tensor_print_grad: the values, then the gradient in the same layout.
#include <stdlib.h>

#include "op_checks.h"

static char *print_grad_to_string(const ag_tensor *t) {
    FILE *f = tmpfile();
    ag_tensor_print_grad(t, f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    fclose(f);
    return s;
}

static void test_prints_values_then_gradient(void) {
    ag_tensor *x = requiring_grad(ag_tensor_from(AG_F64, 2, (int[]){2, 2}, (double[]){1, 2, 3, 4}));
    ag_tensor_set_name(x, "x");
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, ag_mul(tp, x, x)));  // dx = 2x
    char *s = print_grad_to_string(x);
    const char *want = "x: f64 [2,2] requires_grad\n"
                       "  [        1         2]\n"
                       "  [        3         4]\n"
                       "grad:\n"
                       "  [        2         4]\n"
                       "  [        6         8]\n";
    if (strcmp(s, want) != 0) fprintf(stderr, "got:\n%s", s);
    CHECK(strcmp(s, want) == 0);
    free(s);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_says_when_no_gradient_has_arrived(void) {
    ag_tensor *x = ag_tensor_ones(AG_F32, 0, NULL);
    char *s = print_grad_to_string(x);
    CHECK(strcmp(s, "f32 []\n1\ngrad: none (no backward has reached it)\n") == 0);
    free(s);
    ag_tensor_free(x);
}

int main(void) {
    RUN(test_prints_values_then_gradient);
    RUN(test_says_when_no_gradient_has_arrived);
    return testing_summary();
}
