// Batched matrix product with optional transposes (Q K^T, A V).
//   a: [..., M, K] (or [..., K, M] with ta), b: [..., K, N] (or [..., N, K] with tb)
//   -> c: [..., M, N], one product per batch matrix (leading dims equal).
//   C = op(A) op(B) gives d op(A) = dC op(B)^T and d op(B) = op(A)^T dC; a
//   transposed operand takes the transpose of that: dA = op(B) dC^T, dB = dC^T op(A).
#include <limits.h>
#include <stdio.h>

#include "op.h"

typedef struct {
    bool ta, tb;
} matmul_params;

// One batch of products, with every size and stride the slices need.
typedef struct {
    bool ta, tb;
    int M, N, K;
    int lda, ldb;       // row strides of the stored a and b matrices
    size_t sa, sb, sc;  // elements per batch matrix of a, b and c
    int count;          // batch matrices
    const real *a, *b, *dc;
    real *c, *da, *db;
} matmul_job;

static matmul_job make_job(const ag_node *n) {
    const matmul_params *p = n->params;
    const ag_tensor *a = n->in[0], *b = n->in[1], *c = n->out;
    int nd = a->ndim;
    matmul_job j;
    j.ta = p->ta;
    j.tb = p->tb;
    j.M = c->shape[nd - 2];
    j.N = c->shape[nd - 1];
    j.K = p->ta ? a->shape[nd - 2] : a->shape[nd - 1];
    j.lda = a->shape[nd - 1];
    j.ldb = b->shape[nd - 1];
    j.sa = (size_t)a->shape[nd - 2] * (size_t)a->shape[nd - 1];
    j.sb = (size_t)b->shape[nd - 2] * (size_t)b->shape[nd - 1];
    j.sc = (size_t)j.M * (size_t)j.N;
    j.count = (int)(c->numel / j.sc);
    j.a = a->data;
    j.b = b->data;
    j.c = c->data;
    j.dc = c->grad;
    j.da = a->grad;
    j.db = b->grad;
    return j;
}

static void forward_slice(int begin, int end, void *ctx) {
    const matmul_job *j = ctx;
    for (int p = begin; p < end; p++)
        R(agi_gemm)(j->ta, j->tb, j->M, j->N, j->K, 1, j->a + p * j->sa, j->lda,
                    j->b + p * j->sb, j->ldb, 0, j->c + p * j->sc, j->N);
}

static void backward_slice(int begin, int end, void *ctx) {
    const matmul_job *j = ctx;
    int M = j->M, N = j->N, K = j->K;
    for (int p = begin; p < end; p++) {
        const real *A = j->a + p * j->sa, *B = j->b + p * j->sb, *dC = j->dc + p * j->sc;
        if (j->da) {
            real *dA = j->da + p * j->sa;
            if (!j->ta)  // dA [M, K] += dC [M, N] op(B)^T
                R(agi_gemm)(false, !j->tb, M, K, N, 1, dC, N, B, j->ldb, 1, dA, K);
            else  // dA [K, M] += op(B) [K, N] dC^T [N, M]
                R(agi_gemm)(j->tb, true, K, M, N, 1, B, j->ldb, dC, N, 1, dA, M);
        }
        if (j->db) {
            real *dB = j->db + p * j->sb;
            if (!j->tb)  // dB [K, N] += op(A)^T [K, M] dC [M, N]
                R(agi_gemm)(!j->ta, false, K, N, M, 1, A, j->lda, dC, N, 1, dB, N);
            else  // dB [N, K] += dC^T [N, M] op(A) [M, K]
                R(agi_gemm)(true, j->ta, N, K, M, 1, dC, N, A, j->lda, 1, dB, K);
        }
    }
}

// A single product splits itself by rows inside gemm; several are split by
// batch matrix, each slice's gemm then running whole on its thread.
static void run(matmul_job *j, double flops_per_batch, void (*slice)(int, int, void *)) {
    if (j->count == 1)
        slice(0, 1, j);
    else
        agi_parallel_for(j->count, flops_per_batch * j->count, slice, j);
}

static void matmul_forward(ag_node *n) {
    matmul_job j = make_job(n);
    run(&j, 2.0 * j.M * j.N * j.K, forward_slice);
}

static void matmul_backward(ag_node *n) {
    matmul_job j = make_job(n);
    double flops = 2.0 * j.M * j.N * j.K * ((j.da != NULL) + (j.db != NULL));
    run(&j, flops, backward_slice);
}

const ag_op R(agi_matmul_op) = {"matmul", matmul_forward, matmul_backward,
    "dA = dC B^T; dB = A^T dC (for C = A B, and a transposed operand takes the transpose: C = A B^T gives dB = dC^T A)"};

#if AG_ONCE
extern const ag_op agi_matmul_op_f32, agi_matmul_op_f64;

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
    int nd = a->ndim;
    if (b->ndim != nd) {
        ag_error("matmul: operands have different numbers of dimensions: %s x %s", sa, sb);
        return NULL;
    }
    for (int i = 0; i < nd - 2; i++) {
        if (a->shape[i] != b->shape[i]) {
            ag_error("matmul: batch dimensions differ: %s x %s", sa, sb);
            return NULL;
        }
    }
    int M = a->shape[nd - (trans_a ? 1 : 2)], Ka = a->shape[nd - (trans_a ? 2 : 1)];
    int Kb = b->shape[nd - (trans_b ? 1 : 2)], N = b->shape[nd - (trans_b ? 2 : 1)];
    if (Ka != Kb) {
        ag_error("matmul: inner dimensions differ: %s x %s", sa, sb);
        return NULL;
    }
    int shape[AG_MAX_DIMS];
    size_t count = 1;
    for (int i = 0; i < nd - 2; i++) {
        shape[i] = a->shape[i];
        count *= (size_t)a->shape[i];
    }
    if (count > INT_MAX) {
        ag_error("matmul: more than %d batch matrices: %s x %s", INT_MAX, sa, sb);
        return NULL;
    }
    shape[nd - 2] = M;
    shape[nd - 1] = N;
    matmul_params p = {trans_a, trans_b};
    ag_tensor *inputs[] = {a, b};
    return ag_apply(tp, agi_pick(a, &agi_matmul_op_f32, &agi_matmul_op_f64), 2, inputs, nd,
                    shape, &p, sizeof p);
}
#endif
