// RoPE inside the fused attention (opts.rope) and the head mask as an attention option:
// equal to the composition they stand for (ag_rope on q and k, then attention; attention,
// then ag_head_mask) in every layout, with the tile kernels and with BLAS, gradchecked,
// float32 against float64, allocation-free, and RoPE inside keeps no rotated copies (its
// tape peak stays near the plain attention's), and ag_rope at positions past INT_MAX.
#define _DEFAULT_SOURCE  // MAP_ANONYMOUS and MAP_NORESERVE

#include <limits.h>
#include <sys/mman.h>

#include "../src/kernels/tile_gemm.h"
#include "../src/ops/op.h"
#include "op_checks.h"

typedef enum { APART, INSIDE, PACKED } layout;

typedef struct {
    layout how;
    int h;
    bool causal, composed;  // composed: ag_rope, then attention without opts.rope
    double dropout;
    int offset;
    ag_tensor *head_mask;  // with composed: ag_head_mask after the attention
} rope_case;

// inputs: q, k, v (APART: [B,h,T,d]; INSIDE: [B,T,h*d]) or qkv (PACKED: [B,T,3*h*d]).
static ag_tensor *attend(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const rope_case *c = user;
    const int d = c->how == APART ? in[0]->shape[3]
                                  : in[0]->shape[2] / (c->how == PACKED ? 3 : 1) / c->h;
    ag_attention_opts o = {.softmax = {.scale = 1 / sqrt(d), .causal = c->causal},
                           .heads = c->how == APART ? 0 : c->h, .dropout = c->dropout,
                           .training = c->dropout > 0, .seed = 9, .site = 2,
                           .rope = !c->composed, .rope_opts = {.pos_offset = c->offset},
                           .head_mask = c->composed ? NULL : c->head_mask};
    ag_rope_opts ro = {.pos_offset = c->offset, .heads = c->how == APART ? 0 : c->h};
    ag_tensor *y;
    if (c->how == PACKED) {
        if (!c->composed) {
            y = ag_attention_packed(tp, in[0], &o);
        } else {  // the columns q | k | v, q and k rotated
            const int E = in[0]->shape[2] / 3;
            ag_tensor *q = ag_rope(tp, ag_slice(tp, in[0], 2, 0, E), &ro);
            ag_tensor *k = ag_rope(tp, ag_slice(tp, in[0], 2, E, E), &ro);
            y = ag_attention(tp, q, k, ag_slice(tp, in[0], 2, 2 * E, E), &o);
        }
    } else if (c->composed) {
        y = ag_attention(tp, ag_rope(tp, in[0], &ro), ag_rope(tp, in[1], &ro), in[2], &o);
    } else {
        y = ag_attention(tp, in[0], in[1], in[2], &o);
    }
    if (y && c->composed && c->head_mask)
        y = ag_head_mask(tp, y, c->head_mask, c->how == APART ? 0 : c->h);
    return y;
}

static int make_inputs(ag_dtype dt, layout how, int B, int h, int T, int S, int d,
                       ag_tensor *in[3], uint64_t seed) {
    if (how == PACKED) {
        in[0] = random_leaf(dt, 3, (int[]){B, T, 3 * h * d}, seed);
        return 1;
    }
    if (how == APART) {
        in[0] = random_leaf(dt, 4, (int[]){B, h, T, d}, seed);
        in[1] = random_leaf(dt, 4, (int[]){B, h, S, d}, seed + 1);
        in[2] = random_leaf(dt, 4, (int[]){B, h, S, d + 2}, seed + 2);
    } else {
        in[0] = random_leaf(dt, 3, (int[]){B, T, h * d}, seed);
        in[1] = random_leaf(dt, 3, (int[]){B, S, h * d}, seed + 1);
        in[2] = random_leaf(dt, 3, (int[]){B, S, h * d}, seed + 2);
    }
    return 3;
}

// Output and input gradients of the case inside against composed, in float64.
static double inside_vs_composed(rope_case c, int B, int T, int S, int d) {
    ag_tensor *in[3];
    const int n = make_inputs(AG_F64, c.how, B, c.h, T, S, d, in, 40 + (uint64_t)T);
    if (c.head_mask) ag_tensor_zero_grad(c.head_mask);
    ag_tape *t1 = ag_tape_new(), *t2 = ag_tape_new();
    ag_tensor *y1 = attend(t1, in, n, &c);
    ag_pcg32 rng = ag_pcg32_make(2, 2);
    ag_tensor *up = ag_tensor_uniform(AG_F64, y1->ndim, y1->shape, &rng, -1, 1);
    ag_backward_with(t1, y1, up);
    ag_tensor *g1[3], *gm = NULL;
    for (int i = 0; i < n; i++) {
        g1[i] = ag_tensor_convert(in[i], AG_F64);
        memcpy(g1[i]->data, in[i]->grad, in[i]->numel * sizeof(double));
        ag_tensor_zero_grad(in[i]);
    }
    if (c.head_mask) {
        gm = ag_tensor_convert(c.head_mask, AG_F64);
        memcpy(gm->data, c.head_mask->grad, c.head_mask->numel * sizeof(double));
        ag_tensor_zero_grad(c.head_mask);
    }
    c.composed = true;
    ag_tensor *y2 = attend(t2, in, n, &c);
    ag_backward_with(t2, y2, up);
    double worst = 0;
    for (size_t e = 0; e < y1->numel; e++)
        worst = fmax(worst, fabs(ag_tensor_item(y1, e) - ag_tensor_item(y2, e)));
    for (int i = 0; i < n; i++) {
        for (size_t e = 0; e < in[i]->numel; e++)
            worst = fmax(worst, fabs(ag_tensor_item(g1[i], e) - ((double *)in[i]->grad)[e]));
        ag_tensor_free(g1[i]);
        ag_tensor_free(in[i]);
    }
    if (gm) {
        for (size_t e = 0; e < gm->numel; e++)
            worst = fmax(worst, fabs(ag_tensor_item(gm, e) - ((double *)c.head_mask->grad)[e]));
        ag_tensor_free(gm);
    }
    ag_tensor_free(up);
    ag_tape_free(t1);
    ag_tape_free(t2);
    return worst;
}

static void test_rope_inside_equals_rope_then_attention(void) {
    // T = 300 and S = 270 take several blocks of queries and keys (256 each).
    const int sizes[][3] = {{1, 1, 2}, {7, 7, 4}, {33, 20, 8}, {300, 270, 16}};
    double worst = 0;
    for (int tiles = 1; tiles >= 0; tiles--) {
        agi_tile_gemm_enable(tiles);
        for (int s = 0; s < 4; s++) {
            const int T = sizes[s][0], S = sizes[s][1], d = sizes[s][2];
            rope_case apart = {APART, 2, false, false, 0, 0, NULL};
            rope_case inside = {INSIDE, 3, true, false, 0.2, 5, NULL};
            rope_case packed = {PACKED, 2, true, false, 0, 0, NULL};
            worst = fmax(worst, inside_vs_composed(apart, 2, T, S, d));
            worst = fmax(worst, inside_vs_composed(inside, 1, T, S, d));
            worst = fmax(worst, inside_vs_composed(packed, 2, T, T, d));
        }
    }
    agi_tile_gemm_enable(true);
    printf("rope inside vs ag_rope + attention: worst abs difference %.2e\n", worst);
    CHECK(worst < 1e-12);
}

static void test_rope_inside_gradcheck_and_f32(void) {
    const layout hows[] = {APART, INSIDE, PACKED};
    for (int k = 0; k < 3; k++) {
        rope_case c = {hows[k], 2, k == 1, false, 0, 3, NULL};
        ag_tensor *in[3];
        const int n = make_inputs(AG_F64, c.how, 2, 2, 5, 5, 4, in, 70 + (uint64_t)k);
        ag_gradcheck_result r;
        CHECK(ag_gradcheck(attend, in, n, &c, NULL, &r));
        CHECK(f32_vs_f64_error(attend, in, n, &c) < 1e-5);
        for (int i = 0; i < n; i++) ag_tensor_free(in[i]);
    }
}

static void test_head_mask_option_equals_the_op_after(void) {
    ag_tensor *mask = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){1.0, 0.0, -0.5});
    ag_tensor_set_requires_grad(mask, true);
    rope_case c = {INSIDE, 3, true, false, 0, 0, mask};
    double worst = inside_vs_composed(c, 2, 6, 6, 4);
    c.how = APART;
    worst = fmax(worst, inside_vs_composed(c, 2, 6, 6, 4));
    CHECK(worst < 1e-13);
    ag_tensor *in[3];
    c.how = PACKED;
    const int n = make_inputs(AG_F64, c.how, 2, 3, 4, 4, 2, in, 90);
    ag_tensor *all[4] = {in[0], mask};
    ag_gradcheck_result r;
    CHECK(ag_gradcheck(attend, all, n + 1, &c, NULL, &r));
    ag_tensor_free(in[0]);
    ag_tensor_free(mask);
}

static void rope_step(ag_tape *tp, int step, void *user) {
    (void)step;
    ag_tensor **qkv = user;
    rope_case c = {PACKED, 4, true, false, 0.1, 0, NULL};
    ag_backward(tp, ag_sum(tp, attend(tp, qkv, 1, &c)));
}

static void test_a_repeated_rope_step_allocates_nothing(void) {
    ag_tensor *qkv = random_leaf(AG_F32, 3, (int[]){4, 40, 3 * 64}, 3);
    CHECK(repeated_step_allocates_nothing(rope_step, &qkv));
    ag_tensor_free(qkv);
}

// The tape peak of a MultiheadAttention forward + backward (packed projection, fused
// attention, output projection) at T = 4096: plain, RoPE inside (its cos/sin table and a
// few blocks of scratch), and ag_rope's rotated copies of q and k with their gradients.
static size_t mha_peak(int how) {  // 0 plain, 1 rope inside, 2 ag_rope then attention
    const int T = 4096, E = 64, h = 4;
    ag_tensor *x = random_leaf(AG_F32, 3, (int[]){1, T, E}, 4);
    ag_tensor *w_in = random_leaf(AG_F32, 2, (int[]){3 * E, E}, 5);
    ag_tensor *w_out = random_leaf(AG_F32, 2, (int[]){E, E}, 6);
    ag_tape *tp = ag_tape_new();
    ag_tensor *qkv = ag_linear(tp, x, w_in, NULL), *y;
    if (how == 2) {
        rope_case c = {PACKED, h, true, true, 0, 0, NULL};
        y = attend(tp, &qkv, 1, &c);
    } else {
        ag_attention_opts o = {.softmax = {.scale = 0.25, .causal = true}, .heads = h,
                               .rope = how == 1};
        y = ag_attention_packed(tp, qkv, &o);
    }
    ag_backward(tp, ag_sum(tp, ag_linear(tp, y, w_out, NULL)));
    const size_t peak = ag_tape_usage(tp).bytes_peak;
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(w_in), ag_tensor_free(w_out);
    return peak;
}

static void test_rope_inside_keeps_no_rotated_copies(void) {
    const double plain = (double)mha_peak(0), inside = (double)mha_peak(1),
                 copies = (double)mha_peak(2);
    printf("MHA tape peak at T = 4096, E = 64, h = 4: plain %.2f MiB, rope inside %.2f MiB "
           "(%+.1f%%), ag_rope copies %.2f MiB (%+.1f%%)\n",
           plain / 1048576, inside / 1048576, 100 * inside / plain - 100, copies / 1048576,
           100 * copies / plain - 100);
    CHECK(inside < 1.10 * plain);
}

static void test_rope_errors_are_one_line(void) {
    ag_tensor *q = random_leaf(AG_F32, 4, (int[]){1, 2, 3, 5}, 1);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    ag_attention_opts o = {.rope = true};
    CHECK(ag_attention(tp, q, q, q, &o) == NULL);
    CHECK(strstr(testing_last_error, "attention: rope needs an even head width d") != NULL);
    CHECK(strstr(testing_last_error, "d = 5") != NULL && !strchr(testing_last_error, '\n'));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(q);
}

// A position past INT_MAX: pos_offset = INT_MAX, so row 1 sits at 2^31. Its angle was
// taken as (int)(offset + t), which wrapped to -2^31 (signed overflow). Expected values from
// PyTorch 1.13 in float64, the rotate_half formula of HuggingFace:
//   inv = 10000.0 ** (-torch.arange(0, 4, 2).double() / 4); t = torch.arange(2).double() + 2**31 - 1
//   emb = cat([outer(t, inv)] * 2, -1); y = x * emb.cos() + rotate_half(x) * emb.sin()
static void test_rope_positions_past_int_max(void) {
    const double x[] = {1, 0, 0, 1, 0.5, -0.25, 2, 1};
    const double want[] = {-0.6888366918779438, -0.7013495734677571, -0.7249165551445564,
                           -0.712817491225205,  2.0615284488722803,  -0.5142376413342502,
                           -0.010022698750862868, -0.893341842877063};
    ag_tensor *t = ag_tensor_from(AG_F64, 4, (int[]){1, 1, 2, 4}, x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_rope(tp, t, &(ag_rope_opts){.base = 10000, .pos_offset = INT_MAX});
    CHECK(y != NULL);
    for (int i = 0; y && i < 8; i++) CHECK_NEAR(ag_tensor_item(y, (size_t)i), want[i], 1e-12);
    ag_tape_free(tp);
    ag_tensor_free(t);
}

// The sines of a table [2T, d/2] start at row T: row t's was found at T + t, an int sum, so
// that a table of more than 2^30 positions (x or the keys of over 8 GB with d = 2) wrapped
// past INT_MAX to a row 8 GB before the table. Shown on the rows themselves, the table a
// reserved mapping of which two pages are touched: T = INT_MAX, row 1, whose sine is at
// row 2^31. cos 0.6 and sin 0.8 rotate (1, 2) to (1 * 0.6 - 2 * 0.8, 2 * 0.6 + 1 * 0.8).
static void test_rope_rows_of_a_table_past_int_max_rows(void) {
    const int T = INT_MAX;
    const size_t bytes = 2 * (size_t)T * sizeof(float) + 4096;
    float *cs = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(cs != MAP_FAILED);
    if (cs == MAP_FAILED) return;
    cs[1] = 0.6f;                    // cos of row 1
    cs[(size_t)T + 1] = 0.8f;        // sin of row 1, at 2^31
    const float x[2] = {1, 2};
    float y[2] = {0, 0};
    agi_rope_rows_f32(cs, T, 1, 2, x, 2, y, 2, 1, 1, false);
    CHECK_NEAR(y[0], 1 * 0.6 - 2 * 0.8, 1e-6);
    CHECK_NEAR(y[1], 2 * 0.6 + 1 * 0.8, 1e-6);
    munmap(cs, bytes);
}

int main(void) {
    RUN(test_rope_inside_equals_rope_then_attention);
    RUN(test_rope_inside_gradcheck_and_f32);
    RUN(test_head_mask_option_equals_the_op_after);
    RUN(test_a_repeated_rope_step_allocates_nothing);
    RUN(test_rope_inside_keeps_no_rotated_copies);
    RUN(test_rope_errors_are_one_line);
    RUN(test_rope_positions_past_int_max);
    RUN(test_rope_rows_of_a_table_past_int_max_rows);
    return testing_summary();
}
