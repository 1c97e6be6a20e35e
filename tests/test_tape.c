// Tape semantics: recording, accumulation, reuse, no-grad, reset, custom ops,
// and seeing the tape.
#include <stdlib.h>

#include "op_checks.h"

static void test_ops_record_nodes_only_when_an_input_requires_grad(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *a = random_leaf(AG_F64, 1, (int[]){3}, 1);
    ag_tensor *c = ag_tensor_ones(AG_F64, 1, (int[]){3});
    ag_tensor *y = ag_scale(tp, c, 2.0);
    CHECK(ag_tape_num_nodes(tp) == 0);
    CHECK(!y->requires_grad && y->node == NULL);
    CHECK(ag_tensor_item(y, 1) == 2.0);
    ag_tensor *z = ag_add(tp, a, y);
    CHECK(ag_tape_num_nodes(tp) == 1);
    CHECK(z->requires_grad && z->node == ag_tape_node(tp, 0));
    CHECK(strcmp(z->node->op->name, "add") == 0);
    // A node index outside the tape was a silent NULL.
    testing_catch_errors();
    CHECK(ag_tape_node(tp, 1) == NULL);
    CHECK(testing_error_was("tape_node: index 1 is out of range for a tape of 1 nodes"));
    CHECK(ag_tape_node(tp, -1) == NULL);
    CHECK(testing_error_was("tape_node: index -1 is out of range for a tape of 1 nodes"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(a);
    ag_tensor_free(c);
}

static void test_leaf_gradients_accumulate_across_backward_calls(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){4}, 2);
    for (int step = 1; step <= 3; step++) {
        ag_tape_reset(tp);
        ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 3.0)));
        for (size_t i = 0; i < 4; i++) CHECK(ag_tensor_grad_item(x, i) == 3.0 * step);
    }
    ag_tensor_zero_grad(x);
    for (size_t i = 0; i < 4; i++) CHECK(ag_tensor_grad_item(x, i) == 0.0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_tensor_used_twice_gets_the_sum_of_its_gradients(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){2, 3}, 3);
    // y = sum(x * x + x): dy/dx = 2x + 1, through two uses in mul and one in add.
    ag_backward(tp, ag_sum(tp, ag_add(tp, ag_mul(tp, x, x), x)));
    for (size_t i = 0; i < x->numel; i++)
        CHECK_NEAR(ag_tensor_grad_item(x, i), 2 * ag_tensor_item(x, i) + 1, 1e-15);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_backward_twice_on_one_tape_adds_the_same_gradient_again(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){5}, 4);
    ag_tensor *h = ag_mul(tp, x, x);  // an intermediate with its own gradient
    ag_tensor *loss = ag_sum(tp, ag_scale(tp, h, 0.5));
    ag_backward(tp, loss);
    double first[5], hgrad[5];
    for (size_t i = 0; i < 5; i++) {
        first[i] = ag_tensor_grad_item(x, i);
        hgrad[i] = ag_tensor_grad_item(h, i);
    }
    ag_backward(tp, loss);
    for (size_t i = 0; i < 5; i++) {
        CHECK(ag_tensor_grad_item(x, i) == 2 * first[i]);
        // Intermediate gradients are recomputed, not accumulated.
        CHECK(ag_tensor_grad_item(h, i) == hgrad[i]);
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_backward_with_explicit_upstream_gradient(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){2, 2}, 5);
    ag_tensor *y = ag_scale(tp, x, -2.0);
    ag_tensor *dy = ag_tensor_from(AG_F64, 2, (int[]){2, 2}, (double[]){1, 2, 3, 4});
    ag_backward_with(tp, y, dy);
    for (size_t i = 0; i < 4; i++) CHECK(ag_tensor_grad_item(x, i) == -2.0 * (double)(i + 1));
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(dy);
}

// An upstream gradient of the other float dtype is converted (tape.h); one of an integer
// or bool dtype is refused with a line naming its dtype, not a shape "mismatch" between
// two equal shapes.
static void test_backward_with_names_an_upstream_gradient_of_a_storage_dtype(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){2}, 5);
    ag_tensor *y = ag_scale(tp, x, 3.0);
    ag_tensor *dy32 = ag_tensor_from(AG_F32, 1, (int[]){2}, (float[]){0.5f, -1.0f});
    ag_backward_with(tp, y, dy32);
    CHECK(ag_tensor_grad_item(x, 0) == 1.5 && ag_tensor_grad_item(x, 1) == -3.0);
    ag_tensor *dyi = ag_tensor_from(AG_I32, 1, (int[]){2}, (int32_t[]){1, 2});
    testing_catch_errors();
    ag_backward_with(tp, y, dyi);
    CHECK(testing_error_was("backward: upstream gradient i32 [2] must be f32 or f64 (output "
                            "f64 [2])"));
    testing_release_errors();
    CHECK(ag_tensor_grad_item(x, 0) == 1.5 && ag_tensor_grad_item(x, 1) == -3.0);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(dy32);
    ag_tensor_free(dyi);
}

static void test_backward_skips_branches_that_do_not_reach_the_loss(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *a = random_leaf(AG_F64, 1, (int[]){3}, 6);
    ag_tensor *b = random_leaf(AG_F64, 1, (int[]){3}, 7);
    ag_tensor *la = ag_sum(tp, a);
    ag_tensor *lb = ag_sum(tp, ag_scale(tp, b, 2.0));  // recorded, never backpropagated
    (void)lb;
    ag_backward(tp, la);
    CHECK(a->grad != NULL && ag_tensor_grad_item(a, 0) == 1.0);
    CHECK(b->grad == NULL);
    ag_tape_free(tp);
    ag_tensor_free(a);
    ag_tensor_free(b);
}

static void test_no_grad_mode_computes_but_records_nothing(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 8);
    bool was = ag_tape_set_grad_enabled(tp, false);
    CHECK(was);
    ag_tensor *y = ag_scale(tp, x, 2.0);
    CHECK(ag_tape_num_nodes(tp) == 0);
    CHECK(!y->requires_grad);
    CHECK(ag_tensor_item(y, 2) == 2.0 * ag_tensor_item(x, 2));
    ag_tape_set_grad_enabled(tp, was);
    CHECK(ag_tape_grad_enabled(tp));
    ag_scale(tp, x, 2.0);
    CHECK(ag_tape_num_nodes(tp) == 1);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_reset_forgets_nodes_and_reuses_the_same_memory(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F32, 2, (int[]){64, 64}, 9);
    ag_tensor *first = NULL;
    size_t reserved = 0;
    for (int step = 0; step < 3; step++) {
        ag_tape_reset(tp);
        CHECK(ag_tape_num_nodes(tp) == 0);
        ag_tensor *y = ag_scale(tp, x, 2.0);
        ag_backward(tp, ag_sum(tp, y));
        if (step == 0) {
            first = y;
            reserved = ag_tape_usage(tp).bytes_reserved;
        } else {
            CHECK(y == first);  // same arena position every step
            CHECK(ag_tape_usage(tp).bytes_reserved == reserved);
        }
    }
    CHECK(ag_tape_usage(tp).bytes_used > 64 * 64 * sizeof(float));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A user-defined op: y = x^3 elementwise, with forward and backward callbacks.
static void cube_forward(ag_node *n) {
    const double *x = n->in[0]->data;
    double *y = n->out->data;
    for (size_t i = 0; i < n->out->numel; i++) y[i] = x[i] * x[i] * x[i];
}

static void cube_backward(ag_node *n) {
    const double *x = n->in[0]->data, *dy = n->out->grad;
    double *dx = n->in[0]->grad;
    for (size_t i = 0; i < n->out->numel; i++) dx[i] += 3 * x[i] * x[i] * dy[i];
}

static const ag_op cube_op = {"cube", cube_forward, cube_backward, NULL};

static ag_tensor *cube(ag_tape *tp, ag_tensor *x) {
    return ag_op_apply(tp, &cube_op, 1, &x, x->ndim, x->shape, NULL, 0);
}

static ag_tensor *cube_then_scale(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    (void)user;
    return ag_scale(tp, cube(tp, in[0]), 0.5);
}

static void test_custom_op_joins_the_tape_like_a_builtin(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){2, 3}, 10);
    ag_tensor *y = cube(tp, x);
    CHECK(y->node && y->node->op == &cube_op);
    ag_backward(tp, ag_sum(tp, y));
    for (size_t i = 0; i < x->numel; i++) {
        double v = ag_tensor_item(x, i);
        CHECK_NEAR(ag_tensor_grad_item(x, i), 3 * v * v, 1e-15);
    }
    ag_gradcheck_result r;
    CHECK(ag_gradcheck(cube_then_scale, &x, 1, NULL, NULL, &r));
    CHECK(r.checked == 6);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A custom op with parameters: params are copied into tape memory, so the
// caller's struct may go out of scope before backward.
typedef struct {
    double power_scale;
} scaled_params;

static void scaled_forward(ag_node *n) {
    const scaled_params *p = n->params;
    const double *x = n->in[0]->data;
    double *y = n->out->data;
    for (size_t i = 0; i < n->out->numel; i++) y[i] = p->power_scale * x[i];
}

static void scaled_backward(ag_node *n) {
    const scaled_params *p = n->params;
    for (size_t i = 0; i < n->out->numel; i++)
        ((double *)n->in[0]->grad)[i] += p->power_scale * ((const double *)n->out->grad)[i];
}

static const ag_op scaled_op = {"scaled", scaled_forward, scaled_backward, NULL};

static void test_custom_op_params_are_copied_into_the_tape(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 11);
    ag_tensor *y;
    {
        scaled_params p = {4.0};
        y = ag_op_apply(tp, &scaled_op, 1, &x, 1, x->shape, &p, sizeof p);
        p.power_scale = -1.0;  // must not affect the recorded node
    }
    ag_backward(tp, ag_sum(tp, y));
    CHECK(ag_tensor_grad_item(x, 0) == 4.0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A tensor that stops requiring grad keeps its gradient buffer (a parameter store holds
// one for every parameter; a heap leaf keeps the one an earlier backward made), and
// backward must leave it alone, as PyTorch leaves a frozen parameter's .grad: here
// d sum(x * w) / dw = x, and x's gradient stays the 1s of the first step.
static void test_a_frozen_tensor_receives_no_gradient(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 14);
    ag_tensor *w = ag_tensor_ones(AG_F64, 1, (int[]){3});
    ag_tensor_set_requires_grad(w, true);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, w, x)));
    ag_tensor_set_requires_grad(x, false);
    ag_tape_reset(tp);
    ag_backward(tp, ag_sum(tp, ag_add(tp, ag_mul(tp, x, w), ag_mul(tp, x, x))));
    for (size_t i = 0; i < 3; i++) {
        CHECK(ag_tensor_grad_item(x, i) == 1.0);
        CHECK(ag_tensor_grad_item(w, i) == 2.0 * ag_tensor_item(x, i));
    }
    // A frozen parameter of a store: the global norm counts only the others.
    ag_params *ps = ag_params_new(AG_F64);
    ag_tensor *a = ag_params_add(ps, "a", 1, (int[]){2});
    ag_tensor *b = ag_params_add(ps, "b", 1, (int[]){2});
    ag_tensor_fill(a, 3.0);
    ag_tensor_fill(b, 4.0);
    ag_tensor_set_requires_grad(b, false);
    ag_tape_reset(tp);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, a, b)));  // d/da = b = 4, twice: norm sqrt(32)
    CHECK(ag_tensor_grad_item(b, 0) == 0.0 && ag_tensor_grad_item(b, 1) == 0.0);
    CHECK_NEAR(ag_params_grad_norm(ps), sqrt(32.0), 1e-15);
    ag_params_free(ps);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(w);
}

// Clearing requires_grad on an op's output cut the graph there silently, as a detach;
// PyTorch refuses it ("you can only change requires_grad flags of leaf variables"). The
// way to cut a graph is ag_detach: values shared, no history. torch 1.13: with
// x = [1, 2, 3] requiring grad, y = 2x, loss = sum(x * y.detach()) gives dx = y = 2x.
static void test_an_outputs_flag_is_refused_and_detach_cuts_the_graph(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){1, 2, 3});
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *y = ag_scale(tp, x, 2.0);
    testing_catch_errors();
    ag_tensor_set_requires_grad(y, false);
    CHECK(testing_error_was("set_requires_grad: [3] is the output of op scale, not a leaf: "
                            "only a leaf's flag can change (ag_detach(tp, x) gives x without "
                            "its history)"));
    CHECK(y->requires_grad);
    ag_tensor_set_requires_grad(y, true);  // no change: allowed, as in PyTorch
    CHECK(testing_error_count == 0);
    CHECK(!ag_detach(NULL, y) && testing_error_was("detach: the tape is NULL"));
    CHECK(!ag_detach(tp, NULL) && testing_error_was("detach: the tensor is NULL"));
    testing_release_errors();
    ag_tensor *d = ag_detach(tp, y);
    CHECK(d && !d->requires_grad && !d->node && !d->grad && d->data == y->data &&
          d->ndim == 1 && d->shape[0] == 3 && d->dtype == AG_F64);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, x, d)));
    for (size_t i = 0; i < 3; i++) CHECK(ag_tensor_grad_item(x, i) == 2.0 * (double)(i + 1));
    CHECK(y->grad == NULL);  // nothing reached y's node
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// Written in place between forward and backward: torch 1.13 refuses the backward of
// l = (w * x).sum() after opt.step() or w.fill_() under no_grad ("one of the variables
// needed for gradient computation has been modified by an inplace operation"), since w's
// gradient and x's would be taken at values the forward did not see. x's gradient here
// would have been the new w, silently. A forward after the write records the new values.
static void test_a_parameter_written_after_recording_refuses_backward(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_tensor *w = ag_params_add(ps, "w", 1, (int[]){3});
    ag_tensor_fill(w, 1.0);
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 16);
    ag_optim_config cfg = ag_optim_defaults(AG_SGD);
    cfg.lr = 0.5;
    ag_optim *o = ag_optim_new(ps, &cfg);
    ag_tape *tp = ag_tape_new();
    ag_tensor *loss = ag_sum(tp, ag_mul(tp, w, x));
    ag_backward(tp, loss);
    ag_optim_step(o);  // w = 1 - 0.5 x
    ag_params_zero_grad(ps);
    ag_tensor_zero_grad(x);
    testing_catch_errors();
    ag_backward(tp, loss);
    CHECK(testing_error_was("backward: parameter 'w' [3] was written in place after this tape "
                            "recorded it (by ag_optim_step, a load, an init, or "
                            "ag_tensor_fill, _copy or _set_item): run the forward again, or "
                            "step after backward"));
    ag_tape_check_report r;
    CHECK(!ag_tape_check(tp, NULL, &r) && testing_error_count == 1 &&
          strncmp(testing_last_error, "tape_check: parameter 'w' [3] was written in place",
                  50) == 0);
    testing_release_errors();
    for (size_t i = 0; i < 3; i++)
        CHECK(ag_tensor_grad_item(w, i) == 0.0 && ag_tensor_grad_item(x, i) == 0.0);

    ag_tape_reset(tp);
    loss = ag_sum(tp, ag_mul(tp, w, x));
    ag_tensor_fill(w, 2.0);  // an in-place write of another kind, after the new forward
    testing_catch_errors();
    ag_backward(tp, loss);
    CHECK(testing_error_count == 1);
    testing_release_errors();

    ag_tape_reset(tp);
    loss = ag_sum(tp, ag_mul(tp, w, x));
    ag_tensor_set_item(x, 1, 0.25);  // a leaf that requires grad is held to the same
    testing_catch_errors();
    ag_backward(tp, loss);
    CHECK(testing_error_was("backward: leaf [3] was written in place after this tape "
                            "recorded it (by ag_optim_step, a load, an init, or "
                            "ag_tensor_fill, _copy or _set_item): run the forward again, or "
                            "step after backward"));
    testing_release_errors();

    ag_tape_reset(tp);
    loss = ag_sum(tp, ag_mul(tp, w, x));
    ag_backward(tp, loss);
    for (size_t i = 0; i < 3; i++) {
        CHECK(ag_tensor_grad_item(w, i) == ag_tensor_item(x, i));
        CHECK(ag_tensor_grad_item(x, i) == 2.0);
    }
    ag_tape_free(tp);
    ag_optim_free(o);
    ag_params_free(ps);
    ag_tensor_free(x);
}

// Frozen between forward and backward: PyTorch's AccumulateGrad skips a leaf that no
// longer requires grad (torch 1.13: l = (w * x).sum(); w.requires_grad_(False);
// l.backward() leaves w.grad None, or as it was), while the other inputs get theirs. The parameter w, used twice, kept
// its gradient buffer and took 2 x again; x, d sum(w * x + w * w)/dx = w = 1, takes it.
// Unfrozen again, the next backward of the same tape reaches it as before.
static void test_a_parameter_frozen_after_recording_receives_no_gradient(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_tensor *w = ag_params_add(ps, "w", 1, (int[]){3});
    ag_tensor_fill(w, 1.0);
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 15);
    ag_tape *tp = ag_tape_new();
    ag_tensor *loss = ag_sum(tp, ag_add(tp, ag_mul(tp, w, x), ag_mul(tp, w, w)));
    ag_tensor_set_requires_grad(w, false);
    ag_backward(tp, loss);
    for (size_t i = 0; i < 3; i++) {
        CHECK(ag_tensor_grad_item(w, i) == 0.0);
        CHECK(ag_tensor_grad_item(x, i) == 1.0);
    }
    ag_tensor_set_requires_grad(w, true);
    ag_backward(tp, loss);  // dw = x + 2w
    for (size_t i = 0; i < 3; i++) {
        CHECK(ag_tensor_grad_item(w, i) == ag_tensor_item(x, i) + 2.0);
        CHECK(ag_tensor_grad_item(x, i) == 2.0);
    }
    ag_tape_free(tp);
    ag_params_free(ps);
    ag_tensor_free(x);
}

// The view of a gradient no backward has reached has no data: as an op's input, an index
// or an upstream gradient it is reported in one line, never read through NULL.
static void test_a_gradient_view_without_data_is_refused_where_data_is_read(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 15);
    ag_tensor *ids = ag_tensor_zeros(AG_I64, 1, (int[]){2});
    ag_tensor g = ag_tensor_grad_view(x), gi = ag_tensor_grad_view(ids);
    testing_catch_errors();
    CHECK(ag_add(tp, x, &g) == NULL);
    CHECK(testing_error_was(
        "add: input 1 [3] has no data (a gradient view no backward has reached)"));
    CHECK(ag_index_select(tp, x, 0, &gi) == NULL);
    CHECK(testing_error_was(
        "index_select: index [2] has no data (a gradient view no backward has reached)"));
    ag_tensor *y = ag_scale(tp, x, 2.0);
    ag_backward_with(tp, y, &g);
    CHECK(testing_error_was("backward: upstream gradient [3] has no data (a gradient view no "
                            "backward has reached)"));
    CHECK(x->grad == NULL);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(ids);
}

// An upstream gradient may be the view of an intermediate's gradient from an earlier
// backward (here dy = 1s, left in h's gradient by backward from sum(h)): backward zeroes
// intermediate gradients first, and must read dy before. h = 3x, so x gains 3 dy = 3.
static void test_backward_with_reads_a_gradient_view_before_zeroing_it(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 16);
    ag_tensor *h = ag_scale(tp, x, 3.0);
    ag_backward(tp, ag_sum(tp, h));
    ag_tensor_zero_grad(x);
    ag_tensor dy = ag_tensor_grad_view(h);
    ag_backward_with(tp, h, &dy);
    for (size_t i = 0; i < 3; i++) CHECK(ag_tensor_grad_item(x, i) == 3.0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_backward_errors_name_the_problem(void) {
    testing_catch_errors();
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 12);
    ag_tensor *y = ag_scale(tp, x, 2.0);
    ag_backward(tp, y);
    CHECK(strstr(testing_last_error, "backward: loss must be a scalar, got [3]") != NULL);
    ag_tensor *c = ag_tensor_ones(AG_F64, 1, (int[]){3});
    ag_backward(tp, ag_sum(tp, c));
    CHECK(strstr(testing_last_error, "does not require grad") != NULL);
    CHECK(ag_add(tp, x, NULL) == NULL);
    CHECK(strcmp(testing_last_error, "add: b is NULL") == 0);
    ag_tensor *m = ag_tensor_zeros(AG_F64, 2, (int[]){2, 4});
    CHECK(ag_add(tp, x, m) == NULL);
    CHECK(strcmp(testing_last_error,
                 "add: shapes [3] and [2,4] do not broadcast") == 0);
    ag_tensor *f = ag_tensor_zeros(AG_F32, 1, (int[]){3});
    CHECK(ag_add(tp, x, f) == NULL);
    CHECK(strcmp(testing_last_error, "add: dtypes differ: f64 [3] and f32 [3]") == 0);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(c);
    ag_tensor_free(m);
    ag_tensor_free(f);
}

// Backward walks one tape's nodes: an input recorded on another tape, or on this
// one before a reset, would take a gradient and pass none of it on (x would get
// 1 instead of 4 below). Refused while recording; in no-grad mode it is a value.
static void test_an_input_from_another_tape_or_before_a_reset_is_an_error(void) {
    ag_tape *tp = ag_tape_new(), *other = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 13);
    ag_tensor *a = ag_scale(other, x, 3.0);
    testing_catch_errors();
    CHECK(ag_add(tp, a, x) == NULL);
    CHECK(testing_error_was("add: input 0 [3] was recorded on another tape (or on this one "
                            "before ag_tape_reset): its gradient would stop there"));
    ag_tensor *y = ag_scale(tp, x, 2.0);
    ag_tape_reset(tp);
    CHECK(ag_sum(tp, y) == NULL);
    CHECK(testing_error_was("sum: input 0 [3] was recorded on another tape (or on this one "
                            "before ag_tape_reset): its gradient would stop there"));
    testing_release_errors();
    CHECK(ag_tape_num_nodes(tp) == 0 && x->grad == NULL);
    ag_tape_set_grad_enabled(tp, false);
    ag_tensor *v = ag_add(tp, a, x);
    CHECK(v != NULL && ag_tensor_item(v, 0) == 4 * ag_tensor_item(x, 0));
    ag_tape_free(tp);
    ag_tape_free(other);
    ag_tensor_free(x);
}

// A leaf made on tape A and learned through tape B would get its gradient in B's memory:
// after B's reset, the next step's tensors and that gradient shared memory (the leaf's
// gradient read as the bytes of a later tensor). Refused while recording on B; on A, or
// in no-grad mode on B, it is fine.
static void test_a_leaf_made_on_another_tape_is_an_error(void) {
    ag_tape *a = ag_tape_new(), *b = ag_tape_new();
    ag_tensor *x = ag_tape_tensor(a, AG_F64, 1, (int[]){3});
    ag_tensor_fill(x, 2.0);
    ag_tensor_set_requires_grad(x, true);
    testing_catch_errors();
    CHECK(ag_scale(b, x, 3.0) == NULL);
    CHECK(testing_error_was("scale: input 0 [3] is a leaf made on another tape "
                            "(ag_tape_tensor): its gradient would live in this tape's memory "
                            "and go with its reset; make it on this tape, or on the heap"));
    testing_release_errors();
    CHECK(ag_tape_num_nodes(b) == 0 && x->grad == NULL);
    ag_backward(a, ag_sum(a, ag_scale(a, x, 3.0)));
    CHECK(ag_tensor_grad_item(x, 0) == 3.0);
    ag_tape_set_grad_enabled(b, false);
    ag_tensor *v = ag_scale(b, x, 3.0);
    CHECK(v != NULL && ag_tensor_item(v, 2) == 6.0);
    ag_tape_free(a);
    ag_tape_free(b);
}

static char *read_all(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    return s;
}

static void test_tape_print_lists_ops_shapes_and_gradient_norms(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){2, 3}, 13);
    ag_tensor_set_name(x, "x");
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 2.0)));
    FILE *f = tmpfile();
    ag_tape_print(tp, f);
    char *s = read_all(f);
    CHECK(strstr(s, "tape: 2 nodes") != NULL);
    CHECK(strstr(s, "#0   scale          x f64 [2,3] -> f64 [2,3]  |grad| 2.4495e+00") != NULL);
    CHECK(strstr(s, "#1   sum            #0:f64 [2,3] -> f64 []  |grad| 1.0000e+00") != NULL);
    free(s);
    fclose(f);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A custom op may leave its name NULL (ag_op_apply accepts it): every printer shows "?"
// there instead of passing NULL to printf or strcmp.
static void test_printers_show_an_op_without_a_name_as_a_question_mark(void) {
    static const ag_op nameless_op = {NULL, cube_forward, cube_backward, NULL};
    ag_tape *tp = ag_tape_new();
    ag_tape_set_profiling(tp, true);
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){2}, 17);
    ag_tensor *y = ag_op_apply(tp, &nameless_op, 1, &x, 1, x->shape, NULL, 0);
    ag_backward(tp, ag_sum(tp, y));
    FILE *f = tmpfile();
    ag_tape_print(tp, f);
    ag_tape_profile_print(tp, f);
    ag_tape_dot(tp, f);
    char *s = read_all(f);
    CHECK(strstr(s, "#0   ?              f64 [2] -> f64 [2]") != NULL);
    CHECK(strstr(s, "\n?                     1 ") != NULL);  // the profile's row
    CHECK(strstr(s, "label=\"#0 ?\\l") != NULL);
    free(s);
    fclose(f);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_verbose_tape_print_shows_each_node_rule(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){2, 3}, 13);
    ag_backward(tp, ag_sum(tp, ag_softmax(tp, x, NULL)));
    FILE *f = tmpfile();
    ag_tape_print_verbose(tp, f);
    char *s = read_all(f);
    CHECK(strstr(s, "#0   softmax        f64 [2,3] -> f64 [2,3]") != NULL);
    CHECK(strstr(s, "\n        rule: dx = scale * y * (dy - sum(dy * y)); an additive mask or "
                    "position bias gets the same without the scale, summed over the scores "
                    "it serves\n  #1   sum") != NULL);
    CHECK(strstr(s, "\n        rule: dx = dy\n") != NULL);
    free(s);
    fclose(f);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A rule, an op name or a tensor name with quotes or backslashes must not break the DOT
// file.
static void quiet_forward(ag_node *n) { ag_tensor_copy(n->out, n->in[0]); }
static const ag_op quoting_op = {"say \"hi\"", quiet_forward, NULL, "dx = dy \\ \"as is\""};

// A node that the loss reaches and that has no backward is an error before the walk
// starts: no gradient moves, not even those of the nodes after it (which the walk meets
// first).
static void test_missing_backward_is_reported_before_any_gradient_moves(void) {
    static const ag_op forward_only_op = {"forward_only", quiet_forward, NULL, NULL};
    testing_catch_errors();
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 14);
    ag_tensor *a = ag_op_apply(tp, &forward_only_op, 1, &x, 1, x->shape, NULL, 0);
    ag_tensor *loss = ag_sum(tp, ag_add(tp, a, x));  // x also reaches the loss directly
    ag_backward(tp, loss);
    CHECK(testing_error_count == 1);
    CHECK(strcmp(testing_last_error,
                 "backward: op forward_only (node 0) has no backward function") == 0);
    CHECK(x->grad == NULL);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A frozen tensor that holds a gradient buffer (a frozen parameter of a store) is read by
// each node through a header copy of its own: the drawing showed one box per copy, as if
// they were different tensors. It is one box, read by both nodes.
static void test_tape_dot_draws_a_frozen_tensor_read_twice_once(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = random_leaf(AG_F64, 1, (int[]){2}, 15);
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){2}, 16);
    ag_tensor_set_name(w, "frozen_w");
    ag_backward(tp, ag_sum(tp, ag_mul(tp, w, x)));  // w->grad now exists
    ag_tensor_set_requires_grad(w, false);
    ag_tape_reset(tp);
    ag_backward(tp, ag_sum(tp, ag_add(tp, ag_mul(tp, w, x), ag_mul(tp, x, w))));
    FILE *f = tmpfile();
    ag_tape_dot(tp, f);
    char *s = read_all(f);
    int boxes = 0;
    for (const char *p = s; (p = strstr(p, "frozen_w f64 [2]")); p++) boxes++;
    CHECK(boxes == 1);
    CHECK(strstr(s, "\"x0_0\" -> \"n0\";") && strstr(s, "\"x0_0\" -> \"n1\";"));
    free(s);
    fclose(f);
    ag_tape_free(tp);
    ag_tensor_free(w);
    ag_tensor_free(x);
}

static void test_tape_dot_escapes_names_and_rules(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){2}, 14);
    ag_tensor_set_name(x, "a \"quoted\" \\ name");
    ag_op_apply(tp, &quoting_op, 1, &x, 1, (int[]){2}, NULL, 0);
    FILE *f = tmpfile();
    ag_tape_dot(tp, f);
    char *s = read_all(f);
    CHECK(strstr(s, "label=\"#0 say \\\"hi\\\"\\ldx = dy \\\\ \\\"as is\\\"\\l") != NULL);
    CHECK(strstr(s, "input 0: a \\\"quoted\\\" \\\\ name f64 [2]\\l") != NULL);
    free(s);
    fclose(f);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// Top to bottom; one box per op with its rule, one per output; a leaf that several ops read
// (here x, read twice by one mul) is a box of its own, with its values and gradient.
static void test_tape_dot_draws_tensors_ops_values_and_grads(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){2}, (double[]){1.5, -2});
    ag_tensor_set_requires_grad(x, true);
    ag_tensor_set_name(x, "x");
    ag_backward(tp, ag_sum(tp, ag_mul(tp, x, x)));
    FILE *f = tmpfile();
    ag_tape_dot(tp, f);
    char *s = read_all(f);
    CHECK(strncmp(s, "digraph attograd {\n  rankdir=TB;", 32) == 0);
    CHECK(strstr(s, "label=\"#0 mul\\lda = dy * b\\ldb = dy * a\\leach summed over its "
                    "broadcast dims\\l\"]") != NULL);
    CHECK(strstr(s, "label=\"#1 sum\\ldx = dy\\l\"]") != NULL);
    CHECK(strstr(s, "label=\"x f64 [2]\\lvalue  1.5 -2\\l       norm 2.5\\lgrad   3 -4\\l"
                    "       norm 5\\l\"]") != NULL);
    CHECK(strstr(s, "label=\"#1 sum f64 []\\lvalue  6.25\\lgrad   1\\l\"]") != NULL);
    CHECK(strstr(s, "-> \"n1\"") != NULL);
    CHECK(s[strlen(s) - 2] == '}');
    free(s);
    fclose(f);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// The graph's text depends on the tape alone, not on where its tensors happen to live:
// a committed drawing changes only when the model does.
static char *dot_of_a_fresh_tape(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){2}, (double[]){1.5, -2});
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, x, ag_exp(tp, x))));
    FILE *f = tmpfile();
    ag_tape_dot(tp, f);
    char *s = read_all(f);
    fclose(f);
    ag_tape_free(tp);
    ag_tensor_free(x);
    return s;
}

static void test_tape_dot_is_the_same_at_every_run(void) {
    char *pad = malloc(4096);  // the second tape's tensors land elsewhere
    char *a = dot_of_a_fresh_tape(), *b = dot_of_a_fresh_tape();
    CHECK(strcmp(a, b) == 0);
    CHECK(strstr(a, "\"x0_0\" -> \"n0\";\n") != NULL);  // x, first read by #0
    CHECK(strstr(a, "\"x0_0\" -> \"n1\";\n") != NULL);  // and read again by #1
    CHECK(strstr(a, "\"y0\" -> \"n1\";\n") != NULL);    // exp's output, read by mul
    CHECK(strstr(a, "0x") == NULL);                     // no address anywhere
    free(a), free(b), free(pad);
}

// A weight or bias only one op reads is drawn inside that op's box (name, values,
// gradient), so that a layer's parameters do not widen the graph.
static void test_tape_dot_draws_a_leaf_read_once_inside_its_op(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 2, (int[]){1, 2}, (double[]){1, 2});
    ag_tensor *w = ag_tensor_from(AG_F64, 2, (int[]){1, 2}, (double[]){3, -1});
    ag_tensor_set_name(x, "x"), ag_tensor_set_name(w, "W");
    ag_tensor_set_requires_grad(w, true);
    ag_backward(tp, ag_sum(tp, ag_linear(tp, x, w, NULL)));
    FILE *f = tmpfile();
    ag_tape_dot(tp, f);
    char *s = read_all(f);
    CHECK(strstr(s, "\\linput 0: x f64 [1,2]\\lvalue  1 2\\l") != NULL);
    CHECK(strstr(s, "\\linput 1: W f64 [1,2]\\lvalue  3 -1\\l       norm 3.162\\lgrad   1 2"
                    "\\l") != NULL);
    CHECK(strstr(s, "label=\"x f64") == NULL);  // no box of its own
    CHECK(strstr(s, "label=\"W f64") == NULL);
    free(s);
    fclose(f);
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(w);
}

int main(void) {
    RUN(test_ops_record_nodes_only_when_an_input_requires_grad);
    RUN(test_leaf_gradients_accumulate_across_backward_calls);
    RUN(test_tensor_used_twice_gets_the_sum_of_its_gradients);
    RUN(test_backward_twice_on_one_tape_adds_the_same_gradient_again);
    RUN(test_backward_with_explicit_upstream_gradient);
    RUN(test_backward_with_names_an_upstream_gradient_of_a_storage_dtype);
    RUN(test_backward_skips_branches_that_do_not_reach_the_loss);
    RUN(test_no_grad_mode_computes_but_records_nothing);
    RUN(test_reset_forgets_nodes_and_reuses_the_same_memory);
    RUN(test_custom_op_joins_the_tape_like_a_builtin);
    RUN(test_custom_op_params_are_copied_into_the_tape);
    RUN(test_a_frozen_tensor_receives_no_gradient);
    RUN(test_a_parameter_frozen_after_recording_receives_no_gradient);
    RUN(test_an_outputs_flag_is_refused_and_detach_cuts_the_graph);
    RUN(test_a_parameter_written_after_recording_refuses_backward);
    RUN(test_a_gradient_view_without_data_is_refused_where_data_is_read);
    RUN(test_backward_with_reads_a_gradient_view_before_zeroing_it);
    RUN(test_backward_errors_name_the_problem);
    RUN(test_an_input_from_another_tape_or_before_a_reset_is_an_error);
    RUN(test_a_leaf_made_on_another_tape_is_an_error);
    RUN(test_missing_backward_is_reported_before_any_gradient_moves);
    RUN(test_tape_print_lists_ops_shapes_and_gradient_norms);
    RUN(test_verbose_tape_print_shows_each_node_rule);
    RUN(test_printers_show_an_op_without_a_name_as_a_question_mark);
    RUN(test_tape_dot_draws_tensors_ops_values_and_grads);
    RUN(test_tape_dot_draws_a_frozen_tensor_read_twice_once);
    RUN(test_tape_dot_escapes_names_and_rules);
    RUN(test_tape_dot_draws_a_leaf_read_once_inside_its_op);
    RUN(test_tape_dot_is_the_same_at_every_run);
    return testing_summary();
}
