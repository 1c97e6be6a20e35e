// Batched matrix product with optional transposes (Q K^T, A V) and numpy broadcasting of
// the leading (batch) dims.
//   a: [..., M, K] (or [..., K, M] with ta), b: [..., K, N] (or [..., N, K] with tb)
//   -> c: [broadcast(a's and b's leading dims), M, N], one product per batch matrix.
//   C = op(A) op(B) gives d op(A) = dC op(B)^T and d op(B) = op(A)^T dC; a
//   transposed operand takes the transpose of that: dA = op(B) dC^T, dB = dC^T op(A).
// An operand broadcast over several products receives the sum of their gradients, added
// product by product in batch order on one thread (the same every run). The common
// [.., T, d] x [d, S] (a weight shared by every batch matrix, a not transposed) is one
// product of the stacked rows of a, forward and backward.
#include <limits.h>
#include <stdio.h>

#include "op.h"

typedef struct {
    bool ta, tb;
    ag_autocast products;  // the tape's autocast when the op was recorded
} matmul_params;

// One batch of products, with every size and stride the slices need.
typedef struct {
    bool ta, tb;
    int M, N, K;
    int lda, ldb;       // row strides of the stored a and b matrices
    size_t sa, sb, sc;  // elements per batch matrix of a, b and c
    int count;          // batch matrices of c
    int lead1;          // the last leading dim of c (1 when c is 3-D or 2-D)
    size_t step_a[2], step_b[2];  // batch matrices of a and b per step of c's two
                                  // leading dims (0 where broadcast)
    bool full_a, full_b;          // one matrix of a (of b) per matrix of c
    ag_autocast mode;             // the products' precision (matmul_params)
    const real *a, *b, *dc;
    real *c, *da, *db;
} matmul_job;

// Batch matrices of t per step along c's leading dims (padded to two).
static void steps(const ag_tensor *t, const ag_tensor *c, size_t step[2]) {
    int lt = t->ndim - 2, lc = c->ndim - 2;
    size_t s = 1;
    for (int d = 1; d >= 0; d--) {
        int j = d - (2 - lt);  // t's leading dim aligned with padded dim d
        int size = j < 0 ? 1 : t->shape[j];
        int csize = d - (2 - lc) < 0 ? 1 : c->shape[d - (2 - lc)];
        step[d] = size == 1 && csize != 1 ? 0 : s;
        s *= (size_t)size;
    }
}

static matmul_job make_job(const ag_node *n) {
    const matmul_params *p = n->params;
    const ag_tensor *a = n->in[0], *b = n->in[1], *c = n->out;
    matmul_job j;
    j.ta = p->ta;
    j.tb = p->tb;
    j.M = c->shape[c->ndim - 2];
    j.N = c->shape[c->ndim - 1];
    j.K = p->ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    j.lda = a->shape[a->ndim - 1];
    j.ldb = b->shape[b->ndim - 1];
    j.sa = (size_t)a->shape[a->ndim - 2] * (size_t)a->shape[a->ndim - 1];
    j.sb = (size_t)b->shape[b->ndim - 2] * (size_t)b->shape[b->ndim - 1];
    j.sc = (size_t)j.M * (size_t)j.N;
    j.count = (int)(c->numel / j.sc);
    j.lead1 = c->ndim >= 3 ? c->shape[c->ndim - 3] : 1;
    steps(a, c, j.step_a);
    steps(b, c, j.step_b);
    j.full_a = a->numel / j.sa == (size_t)j.count;
    j.full_b = b->numel / j.sb == (size_t)j.count;
    j.a = a->data;
    j.b = b->data;
    j.c = c->data;
    j.dc = c->grad;
    j.da = a->grad;
    j.db = b->grad;
    j.mode = p->products;
    return j;
}

static size_t batch_a(const matmul_job *j, int p) {
    return (size_t)(p / j->lead1) * j->step_a[0] + (size_t)(p % j->lead1) * j->step_a[1];
}
static size_t batch_b(const matmul_job *j, int p) {
    return (size_t)(p / j->lead1) * j->step_b[0] + (size_t)(p % j->lead1) * j->step_b[1];
}

static void forward_slice(int begin, int end, void *ctx) {
    const matmul_job *j = ctx;
    for (int p = begin; p < end; p++)
        R(agi_gemm_autocast)(j->mode, j->ta, j->tb, j->M, j->N, j->K, 1,
                             j->a + batch_a(j, p) * j->sa, j->lda, j->b + batch_b(j, p) * j->sb,
                             j->ldb, 0, NULL, j->c + p * j->sc, j->N);
}

static void backward_a_slice(int begin, int end, void *ctx) {
    const matmul_job *j = ctx;
    int M = j->M, N = j->N, K = j->K;
    for (int p = begin; p < end; p++) {
        const real *B = j->b + batch_b(j, p) * j->sb, *dC = j->dc + p * j->sc;
        real *dA = j->da + batch_a(j, p) * j->sa;
        if (!j->ta)  // dA [M, K] += dC [M, N] op(B)^T
            R(agi_gemm_autocast)(j->mode, false, !j->tb, M, K, N, 1, dC, N, B, j->ldb, 1, NULL,
                                 dA, K);
        else  // dA [K, M] += op(B) [K, N] dC^T [N, M]
            R(agi_gemm_autocast)(j->mode, j->tb, true, K, M, N, 1, B, j->ldb, dC, N, 1, NULL,
                                 dA, M);
    }
}

static void backward_b_slice(int begin, int end, void *ctx) {
    const matmul_job *j = ctx;
    int M = j->M, N = j->N, K = j->K;
    for (int p = begin; p < end; p++) {
        const real *A = j->a + batch_a(j, p) * j->sa, *dC = j->dc + p * j->sc;
        real *dB = j->db + batch_b(j, p) * j->sb;
        if (!j->tb)  // dB [K, N] += op(A)^T [K, M] dC [M, N]
            R(agi_gemm_autocast)(j->mode, !j->ta, false, K, N, M, 1, A, j->lda, dC, N, 1, NULL,
                                 dB, N);
        else  // dB [N, K] += dC^T [N, M] op(A) [M, K]
            R(agi_gemm_autocast)(j->mode, true, j->ta, N, K, M, 1, dC, N, A, j->lda, 1, NULL,
                                 dB, K);
    }
}

// b shared by every product and a stacked in rows: the batch is one taller product, when
// its rows fit an int (the products' extents are ints).
static bool stacked(const matmul_job *j) {
    return j->count > 1 && !j->ta && j->full_a && j->step_b[0] == 0 && j->step_b[1] == 0 &&
           (long long)j->M * j->count <= INT_MAX;
}

static matmul_job as_one_product(matmul_job j) {
    j.M *= j.count;
    j.sa *= (size_t)j.count;
    j.sc *= (size_t)j.count;
    j.count = 1;
    j.lead1 = 1;
    j.step_a[0] = j.step_a[1] = j.step_b[0] = j.step_b[1] = 0;
    return j;
}

// A single product splits itself by rows inside gemm; several are split by
// batch matrix, each slice's gemm then running whole on its thread. A gradient
// shared by several products is accumulated on one thread, in batch order.
static void run(matmul_job *j, double flops_per_batch, bool split,
                void (*slice)(int, int, void *)) {
    if (j->count == 1 || !split)
        slice(0, j->count, j);
    else
        agi_parallel_for(j->count, flops_per_batch * j->count, slice, j);
}

static void matmul_forward(ag_node *n) {
    matmul_job j = make_job(n);
    if (stacked(&j)) j = as_one_product(j);
    run(&j, 2.0 * j.M * j.N * j.K, true, forward_slice);
}

static void matmul_backward(ag_node *n) {
    matmul_job j = make_job(n);
    if (stacked(&j)) j = as_one_product(j);
    double flops = 2.0 * j.M * j.N * j.K;
    if (j.da) run(&j, flops, j.full_a, backward_a_slice);
    if (j.db) run(&j, flops, j.full_b, backward_b_slice);
}

const ag_op R(agi_matmul_op) = {"matmul", matmul_forward, matmul_backward,
    "for y = a b: da = dy b^T; db = a^T dy; a transposed operand takes the transpose: "
    "y = a b^T gives db = dy^T a"};

#if AG_ONCE
// "[7,3]" or, for a transposed operand, "[7,3]^T".
static const char *operand(const ag_tensor *t, bool trans, char *buf, size_t size) {
    snprintf(buf, size, "%s%s", agi_shape(t), trans ? "^T" : "");
    return buf;
}

ag_tensor *ag_matmul(ag_tape *tp, ag_tensor *a, ag_tensor *b, bool trans_a, bool trans_b) {
    if (!agi_check_float("matmul", "a", a) || !agi_check_float("matmul", "b", b) ||
        !agi_check_same_dtype("matmul", a, b) || !agi_check_ndim("matmul", "a", a, 2, 4) ||
        !agi_check_ndim("matmul", "b", b, 2, 4))
        return NULL;
    char bufa[72], bufb[72];
    const char *sa = operand(a, trans_a, bufa, sizeof bufa);
    const char *sb = operand(b, trans_b, bufb, sizeof bufb);
    int la = a->ndim - 2, lb = b->ndim - 2, nd = la > lb ? a->ndim : b->ndim;
    int shape[AG_MAX_DIMS];
    size_t count = 1;
    for (int i = 0; i < nd - 2; i++) {
        int ia = i - (nd - 2 - la), ib = i - (nd - 2 - lb);
        int sa_i = ia < 0 ? 1 : a->shape[ia], sb_i = ib < 0 ? 1 : b->shape[ib];
        if (sa_i != sb_i && sa_i != 1 && sb_i != 1) {
            ag_error("matmul: batch dimensions do not broadcast: %s x %s", sa, sb);
            return NULL;
        }
        shape[i] = sa_i == 1 ? sb_i : sa_i;
        count *= (size_t)shape[i];
    }
    int M = a->shape[a->ndim - (trans_a ? 1 : 2)], Ka = a->shape[a->ndim - (trans_a ? 2 : 1)];
    int Kb = b->shape[b->ndim - (trans_b ? 1 : 2)], N = b->shape[b->ndim - (trans_b ? 2 : 1)];
    if (Ka != Kb) {
        ag_error("matmul: inner dimensions differ: %s x %s", sa, sb);
        return NULL;
    }
    if (count > INT_MAX) {
        ag_error("matmul: more than %d batch matrices: %s x %s", INT_MAX, sa, sb);
        return NULL;
    }
    shape[nd - 2] = M;
    shape[nd - 1] = N;
    matmul_params p = {trans_a, trans_b, ag_tape_autocast(tp)};
    ag_tensor *inputs[] = {a, b};
    return ag_op_apply(tp, agi_pick(a, &agi_matmul_op_f32, &agi_matmul_op_f64), 2, inputs, nd,
                    shape, &p, sizeof p);
}
#endif
