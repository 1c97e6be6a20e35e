// ag_tensor_print_grad: the values, then the gradient in the same layout.
#include <stdlib.h>

#include "op_checks.h"

// What was written to f (a tmpfile), which it closes.
static char *written(FILE *f) {
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    fclose(f);
    return s;
}

static char *print_grad_to_string(const ag_tensor *t) {
    FILE *f = tmpfile();
    ag_tensor_print_grad(t, f);
    return written(f);
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

// A name is user text: one holding a newline split a printed tensor's header, a tape
// listing's node and an error over two lines. Control bytes are written as C escapes.
static char *tape_listing(const ag_tape *tp) {
    FILE *f = tmpfile();
    ag_tape_print(tp, f);
    return written(f);
}

static void test_a_name_with_control_bytes_stays_on_its_line(void) {
    ag_tensor *x = requiring_grad(ag_tensor_from(AG_F64, 1, (int[]){1}, (double[]){2}));
    ag_tensor_set_name(x, "x\nsecond\tline\x1b");
    char *s = print_grad_to_string(x);
    CHECK(strncmp(s, "x\\nsecond\\tline\\x1b: f64 [1] requires_grad\n", 41) == 0);
    free(s);
    ag_tape *tp = ag_tape_new();
    ag_sum(tp, x);
    s = tape_listing(tp);
    int lines = 0;
    for (const char *c = s; *c; c++) lines += *c == '\n';
    CHECK(lines == 2);  // "tape: 1 node" and the node
    CHECK(strstr(s, "x\\nsecond\\tline\\x1b f64 [1]") != NULL);
    free(s);
    ag_params *ps = ag_params_new(AG_F32);
    CHECK(ag_params_add(ps, "w\nv", 1, (int[]){2}));
    testing_catch_errors();
    CHECK(!ag_params_add(ps, "w\nv", 1, (int[]){2}));
    CHECK(testing_error_was("params_add: a parameter named 'w\\nv' already exists"));
    testing_release_errors();
    ag_err err;
    CHECK(ag_params_load(ps, "/no such dir\n/ps.safetensors", &err) != 0);
    CHECK(strchr(err.msg, '\n') == NULL);
    CHECK(strncmp(err.msg, "/no such dir\\n/ps.safetensors: ", 31) == 0);
    ag_params_free(ps);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

int main(void) {
    RUN(test_prints_values_then_gradient);
    RUN(test_says_when_no_gradient_has_arrived);
    RUN(test_a_name_with_control_bytes_stays_on_its_line);
    return testing_summary();
}
