// ag_op_check: each of its checks catches the fault it is there for, on a small op of
// our own that can be made to misbehave one way at a time, and a correct op passes all of
// them. The worked example's softplus (examples/custom_op/) passes; its wrong copy fails
// and the failure names the check and the elements.
#define _POSIX_C_SOURCE 200809L  // fmemopen
#include <stdlib.h>

#include "testing.h"

#include "../examples/custom_op/softplus.c"

// ---- A probe op: y = 2 a + b (b broadcast as a's shape), with one fault or none ---------
typedef enum {
    FAULT_NONE,
    FAULT_GRADIENT,     // backward 1% too large
    FAULT_OVERWRITES,   // backward assigns (=) instead of accumulating (+=)
    FAULT_SHAPES,       // the constructor takes any b, and reads it cyclically
    FAULT_NAN,          // the forward turns NaN into a number
    FAULT_ALLOCATES,    // the forward takes a heap buffer every call
    FAULT_DRIFTS,       // the forward adds 1e-3 every other call
    FAULT_THREADS,      // the forward depends on the thread count
    FAULT_F32,          // the f32 forward is off by 1e-3
} fault;

typedef struct {
    fault f;
} probe_params;

static int probe_calls;

static void probe_forward(ag_node *n) {
    const probe_params *p = n->params;
    const ag_tensor *a = n->in[0], *b = n->in[1];
    ag_tensor *y = n->out;
    double hair = p->f == FAULT_DRIFTS ? 1e-3 * (++probe_calls % 2) : 0;
    double threads = p->f == FAULT_THREADS ? 1e-6 * (ag_threads() - 1) : 0;
    double f32 = p->f == FAULT_F32 && y->dtype == AG_F32 ? 1e-3 : 0;
    if (p->f == FAULT_ALLOCATES) ag_tensor_free(ag_tensor_zeros(AG_F64, 1, (int[]){8}));
    for (size_t i = 0; i < y->numel; i++) {
        double ai = ag_tensor_item(a, i), v = 2 * ai + ag_tensor_item(b, i % b->numel);
        if (p->f == FAULT_NAN && isnan(ai)) v = 0;
        ag_tensor_set_item(y, i, v * (1 + threads + f32) + hair);
    }
}

static void probe_backward(ag_node *n) {
    const probe_params *p = n->params;
    ag_tensor *a = n->in[0], *b = n->in[1];
    ag_tensor ga = ag_tensor_grad_view(a), gb = ag_tensor_grad_view(b);
    double scale = p->f == FAULT_GRADIENT ? 1.01 : 1;
    for (size_t i = 0; i < n->out->numel; i++) {
        double dy = ag_tensor_grad_item(n->out, i);
        double old = p->f == FAULT_OVERWRITES ? 0 : ag_tensor_grad_item(a, i);
        if (a->grad) ag_tensor_set_item(&ga, i, old + 2 * scale * dy);
        size_t j = i % b->numel;
        if (b->grad) ag_tensor_set_item(&gb, j, ag_tensor_grad_item(b, j) + scale * dy);
    }
}

static const ag_op probe_op = {"probe", probe_forward, probe_backward, "da = 2 dy; db = dy"};

static ag_tensor *build_probe(ag_tape *tp, ag_tensor *const in[], const void *args) {
    const probe_params *p = args;
    if (p->f != FAULT_SHAPES && !ag_tensor_same_shape(in[0], in[1])) {
        char sa[64], sb[64];
        ag_error("probe: a %s and b %s differ", ag_tensor_shape_str(in[0], sa, sizeof sa),
                 ag_tensor_shape_str(in[1], sb, sizeof sb));
        return NULL;
    }
    return ag_op_apply(tp, &probe_op, 2, in, in[0]->ndim, in[0]->shape, p, sizeof *p);
}

static const ag_op *const probe_twin[] = {&probe_op, &probe_op};

// The suite on the probe with fault f; the report's lines go to `out` (NULL: none).
static ag_op_check_result check_probe(fault f, FILE *out) {
    probe_params p = {f};
    ag_op_spec spec = {"probe", build_probe, &p, 2,
                       {{.name = "a", .dims = "... N"}, {.name = "b", .dims = "... N"}}, ""};
    ag_op_check_opts o = ag_op_check_defaults();
    o.out = out;
    o.f64_twins = probe_twin;
    o.n_f64_twins = 1;
    ag_op_check_result r;
    ag_op_check(&spec, &o, &r);
    return r;
}

// The report on the probe with fault f, cut into its lines (at most 64).
typedef struct {
    char text[16384];
    const char *line[64];
    int n;
    ag_op_check_result r;
} report_lines;

static void report_of(fault f, report_lines *rl) {
    memset(rl, 0, sizeof *rl);
    FILE *out = fmemopen(rl->text, sizeof rl->text - 1, "w");
    CHECK(out != NULL);
    rl->r = check_probe(f, out);
    if (out) fclose(out);
    for (char *l = strtok(rl->text, "\n"); l && rl->n < 64; l = strtok(NULL, "\n"))
        rl->line[rl->n++] = l;
}

// The report on the probe with fault f has a FAIL line for `check` that holds `words`.
static void expect_failure(fault f, const char *check, const char *words) {
    static report_lines rl;
    char head[128];
    report_of(f, &rl);
    snprintf(head, sizeof head, "  FAIL  probe %s", check);
    bool named = false;
    for (int i = 0; i < rl.n; i++)
        if (strncmp(rl.line[i], head, strlen(head)) == 0 && strstr(rl.line[i], words))
            named = true;
    CHECK(rl.r.failed >= 1 && named);
    if (!named) fprintf(stderr, "  fault %d: no failure of %s with \"%s\"\n", f, check, words);
}

static void test_correct_op_passes_every_check(void) {
    ag_op_check_result r = check_probe(FAULT_NONE, NULL);
    CHECK(r.failed == 0 && r.passed == 14 && r.first_failure[0] == 0);
}

static void test_wrong_gradient_fails_the_gradchecks_naming_elements(void) {
    expect_failure(FAULT_GRADIENT, "gradcheck f64, sizes 3, 4, 5, ...", "element (0,");
    ag_op_check_result r = check_probe(FAULT_GRADIENT, NULL);
    CHECK(r.failed == 8);  // 6 gradchecks and 2 tape checks
}

static void test_overwriting_backward_fails_the_tape_check(void) {
    ag_op_check_result r = check_probe(FAULT_OVERWRITES, NULL);
    // A gradcheck zeroes the gradients first, so only the tape check (random starting
    // gradients) sees it.
    CHECK(r.failed == 2 && strncmp(r.first_failure, "tape check f64", 14) == 0);
}

static void test_accepted_bad_shape_fails(void) {
    expect_failure(FAULT_SHAPES, "bad shapes refused", "accepted");
}

static void test_swallowed_nan_fails(void) {
    expect_failure(FAULT_NAN, "NaN in -> NaN out", "-> 0 of");
}

static void test_allocation_after_warm_up_fails(void) {
    expect_failure(FAULT_ALLOCATES, "no allocation after warm-up", ": 2 in the second call");
}

static void test_drifting_forward_fails_the_replay(void) {
    expect_failure(FAULT_DRIFTS, "repeated call replays", "the output differs");
}

static void test_thread_dependent_result_fails(void) {
    expect_failure(FAULT_THREADS, "threads 1 vs 2", "the output differs");
}

static void test_f32_that_disagrees_with_f64_fails(void) {
    expect_failure(FAULT_F32, "f32 vs f64", "output 1.0e-03");
}

// One line a check, each "  ok" or "  FAIL", then exactly "N passed, M failed".
static void test_report_is_one_line_a_check_and_a_summary(void) {
    static report_lines rl;
    report_of(FAULT_SHAPES, &rl);
    const ag_op_check_result *r = &rl.r;
    CHECK(rl.n == r->passed + r->failed + 1 && r->failed == 1);
    for (int i = 0; i + 1 < rl.n; i++)
        CHECK(strncmp(rl.line[i], "  ok    probe ", 14) == 0 ||
              strncmp(rl.line[i], "  FAIL  probe ", 14) == 0);
    char summary[64];
    snprintf(summary, sizeof summary, "%d passed, %d failed", r->passed, r->failed);
    CHECK(rl.n > 0 && strcmp(rl.line[rl.n - 1], summary) == 0);
}

static void test_unreadable_description_is_one_failure(void) {
    probe_params p = {FAULT_NONE};
    ag_op_spec spec = {"probe", build_probe, &p, 2, {{.name = "a", .dims = "... N?"},
                                                     {.name = "b", .dims = "... N"}}, ""};
    ag_op_check_opts o = ag_op_check_defaults();
    o.out = NULL;
    ag_op_check_result r;
    CHECK(!ag_op_check(&spec, &o, &r));
    CHECK(r.passed == 0 && r.failed == 1);
    CHECK(strcmp(r.first_failure, "description: input 0 (a): cannot read its dims \"... N?\"") ==
          0);
    // A kind outside the enum was filled as a float input and reported as check failures.
    spec.in[0].dims = "... N";
    spec.in[1].kind = (ag_op_input_kind)9;
    CHECK(!ag_op_check(&spec, &o, &r));
    CHECK(r.passed == 0 && r.failed == 1);
    CHECK(strcmp(r.first_failure, "description: input 1 (b): unknown kind 9") == 0);
}

// A NaN tolerance made every comparison fail and eps 0 every gradcheck: the run reported
// a correct op as broken in a dozen lines. Refused up front, with one line.
static void test_refuses_bad_steps_and_tolerances_with_one_line(void) {
    probe_params p = {FAULT_NONE};
    ag_op_spec spec = {"probe", build_probe, &p, 2, {{.name = "a", .dims = "... N"},
                                                     {.name = "b", .dims = "... N"}}, ""};
    testing_catch_errors();
    for (int i = 0; i < 2; i++) {
        ag_op_check_opts o = ag_op_check_defaults();
        o.out = NULL;
        if (i == 0) o.grad.eps = 0;
        else o.f32_vs_f64 = NAN;
        ag_op_check_result r;
        CHECK(!ag_op_check(&spec, &o, &r));
        CHECK(r.passed == 0 && r.failed == 0);
        const char *said = "op_check: probe: grad.eps must be finite and > 0 and ";
        CHECK(testing_error_count == 1 && strncmp(testing_last_error, said, strlen(said)) == 0);
        testing_error_count = 0;
    }
    testing_release_errors();
}

// A description that no tensor can take was read into fixed arrays and crashed the run
// ("K K K K K": five dims; two "..."); sizes past an int wrapped. Each is one failure now,
// and an input with "..." beside three dims gets the one batch dim that fits.
static void test_description_beyond_a_tensor_is_one_failure(void) {
    probe_params p = {FAULT_NONE};
    const char *bad[] = {"K K K K K", "... N ...", "... 99999999999", "0"};
    for (int i = 0; i < 4; i++) {
        ag_op_spec spec = {"probe", build_probe, &p, 2, {{.name = "a", .dims = bad[i]},
                                                         {.name = "b", .dims = bad[i]}}, ""};
        ag_op_check_opts o = ag_op_check_defaults();
        o.out = NULL;
        ag_op_check_result r;
        CHECK(!ag_op_check(&spec, &o, &r));
        CHECK(r.passed == 0 && r.failed == 1);
        const char *said = "description: input 0 (a): cannot read its dims";
        CHECK(strncmp(r.first_failure, said, strlen(said)) == 0);
    }
    ag_op_spec big = {"probe", build_probe, &p, 2, {{.name = "a", .dims = "... N"},
                                                    {.name = "b", .dims = "... N"}},
                      "N>99999999999999999999"};
    ag_op_check_opts o = ag_op_check_defaults();
    o.out = NULL;
    ag_op_check_result r;
    CHECK(!ag_op_check(&big, &o, &r) && r.failed == 1);
    ag_op_spec deep = {"probe", build_probe, &p, 2, {{.name = "a", .dims = "... M N O"},
                                                     {.name = "b", .dims = "... M N O"}}, ""};
    CHECK(ag_op_check(&deep, &o, &r) && r.failed == 0);
}

// Sizes of 1 to 65536 in every dim can describe inputs past the bytes a tensor may hold:
// "N 65536 65536 65536" is 3 x 2^48 elements in the first case. Their tensors could not be
// made, and the first check read them through NULL (a segfault); the large case's element
// count, an int product, overflowed besides. One failure now, naming the input, the case
// and the shape, and no check runs.
static void test_cases_past_a_tensor_are_one_failure(void) {
    probe_params p = {FAULT_NONE};
    ag_op_spec spec = {"probe", build_probe, &p, 2, {{.name = "a", .dims = "N 65536 65536 65536"},
                                                     {.name = "b", .dims = "N 65536 65536 65536"}},
                       ""};
    ag_op_check_opts o = ag_op_check_defaults();
    o.out = NULL;
    ag_op_check_result r;
    CHECK(!ag_op_check(&spec, &o, &r));
    CHECK(r.passed == 0 && r.failed == 1);
    CHECK(strcmp(r.first_failure, "description: input 0 (a) in the case \"sizes 3, 4, 5, ...\" "
                                  "would be f64 [3,65536,65536,65536]: more than the 2^48 bytes "
                                  "a tensor may hold") == 0);
}

// ---- The worked example ---------------------------------------------------------------------
static ag_op_check_result check_softplus(const ag_op_spec *spec) {
    ag_op_check_opts o = ag_op_check_defaults();
    o.out = NULL;
    o.f64_twins = softplus_twins;
    o.n_f64_twins = 2;
    ag_op_check_result r;
    ag_op_check(spec, &o, &r);
    return r;
}

static void test_example_softplus_passes(void) {
    ag_op_check_result r = check_softplus(&softplus_spec);
    CHECK(r.failed == 0 && r.passed == 14);
}

static void test_example_softplus_wrong_copy_fails_naming_check_and_elements(void) {
    ag_op_check_result r = check_softplus(&softplus_wrong_spec);
    CHECK(r.failed == 8);  // 6 gradchecks, 2 tape checks; the rest still pass
    const char *first = "gradcheck f64, sizes 3, 4, 5, ...: [2]: input 0 element (0): expected ";
    CHECK(strncmp(r.first_failure, first, strlen(first)) == 0);
    CHECK(strstr(r.first_failure, ", got ") != NULL);
}

int main(void) {
    RUN(test_correct_op_passes_every_check);
    RUN(test_wrong_gradient_fails_the_gradchecks_naming_elements);
    RUN(test_overwriting_backward_fails_the_tape_check);
    RUN(test_accepted_bad_shape_fails);
    RUN(test_swallowed_nan_fails);
    RUN(test_allocation_after_warm_up_fails);
    RUN(test_drifting_forward_fails_the_replay);
    RUN(test_thread_dependent_result_fails);
    RUN(test_f32_that_disagrees_with_f64_fails);
    RUN(test_report_is_one_line_a_check_and_a_summary);
    RUN(test_unreadable_description_is_one_failure);
    RUN(test_refuses_bad_steps_and_tolerances_with_one_line);
    RUN(test_description_beyond_a_tensor_is_one_failure);
    RUN(test_cases_past_a_tensor_are_one_failure);
    RUN(test_example_softplus_passes);
    RUN(test_example_softplus_wrong_copy_fails_naming_check_and_elements);
    return testing_summary();
}
