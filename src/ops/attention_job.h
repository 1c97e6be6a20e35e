// The plumbing of fused attention (src/ops/attention.c): where each slice of each operand
// lives, one call's job shared by the threads, and each thread's scratch. Typed (see
// src/core/real.h): names that differ by type go through R().
#ifndef ATTOGRAD_ATTENTION_JOB_H
#define ATTOGRAD_ATTENTION_JOB_H

#include "../kernels/score_block.h"
#include "../kernels/tile_gemm.h"
#include "op.h"

// Block sizes, by measurement (bench/bench_mha.c, bench/README.md): a block of scores
// stays in L2 next to its K, V blocks, and products this size still run near the sgemm
// peak. Short sequences take the whole key range at once (no rescaling at all).
enum { BLOCK_Q = 256, BLOCK_K = 256 };

// Where the slices of one operand live: slice n = b*h + head starts `offset` +
// b * batch + head * head elements into its tensor, and its rows are ld apart. A gradient
// has the layout of its tensor.
typedef struct {
    size_t offset;  // of the operand in its tensor: a column block of a packed qkv
    size_t batch, head;
    int ld;
} operand;

typedef struct {
    int B, h, T, S, d, dv;
    int qi, ki, vi;          // input index of q, k and v (all 0 when packed)
    operand q, k, v, o;      // o: the output
    double scale;  // never 0 (the constructor maps 0 to 1)
    bool causal;
    agi_mask_inputs masks;
    double p;  // dropout probability actually applied: 0 when not training
    uint64_t seed, site;
} attention_params;

// Everything one call needs, shared read-only by the threads; per-thread scratch is
// carved out of `scratch` by part.
typedef struct {
    int h, T, S, d, dv;
    size_t slices;  // B * h
    int bq, bk, ld;  // block sizes; ld = row stride of a score block
    real scale;
    bool causal;
    const agi_mask_inputs *mi;  // how the masks map onto the scores; the position bias
    const uint8_t *mask, *kpm;
    const real *add;
    const real *rel;  // position bias by relative position: [h, T + S - 1], or NULL
    double p;  // 0: no dropout
    real keep_scale;  // 1 / (1 - p)
    uint64_t seed, site;
    operand Lq, Lk, Lv, Lo;  // layouts; the pointers below already include the offsets
    bool tiles;  // products through the tile kernels (src/kernels/tile_gemm.h), with k
                 // and v transposed per slice; else through BLAS
    bool stage;  // work on contiguous copies of each slice (see forward_slice_staged)
    const real *q, *k, *v, *o, *dout;
    real *out, *lse;
    real *gq, *gk, *gv, *gadd;
    real **gadd_part;  // per part: where the gradient of an additive mask shared by
                       // slices goes
    real **grel_part;  // per part: the position bias gradient, [h, T + S - 1]
    int parts;
    unsigned char *scratch;
    size_t part_bytes;
} attn_job;

// One part's scratch: score blocks, per-row statistics, dropout masks of a query block,
// and when staging, contiguous copies of a slice's operands.
typedef struct {
    real *s, *pd, *dp;  // [bq, ld] each (pd and dp only in backward)
    real *m;            // running row max (forward)
    double *l, *D;      // running row sum (forward), dO . o (backward)
    uint8_t *keep;      // [bq, S] keep flags when dropout is on
    real *q, *k, *v, *o, *dout, *gq, *gk, *gv;  // staged slice: [T, d], [S, d], [S, dv],
                                                // [T, dv] (o forward, dout backward),
                                                // gq, gk, gv
    real *kt, *vt;  // with tiles: a slice's k^T [d, ldt] and (backward) v^T [dv, ldt]
    int ldt;
} scratch;

// One slice's operands as the kernels see them: where each starts, and its row stride.
// In place they point into the tensors; staged, into the part's scratch.
typedef struct {
    const real *q, *k, *v, *o, *dout;  // o, dout: the output and its gradient (backward)
    real *out, *gq, *gk, *gv;          // the output (forward); gradients, NULL if not wanted
    int ldq, ldk, ldv, ldo, lddo;      // gq, gk, gv have the strides of q, k, v; out of o
} slice_view;

// The operand at `offset` in a tensor's data or gradient (NULL without one).
static inline const real *data_at(const ag_tensor *t, size_t offset) {
    return (const real *)t->data + offset;
}
static inline real *grad_at(const ag_tensor *t, size_t offset) {
    return t->grad ? (real *)t->grad + offset : NULL;
}

// The job of a node: its geometry, masks, dropout and operand pointers (data only; the
// caller adds the output, gradients, saved logsumexps and position bias).
attn_job R(agi_attn_job_of)(const ag_node *node);
// Sizes and carves each part's scratch from tape memory: one part per thread, or one per
// unit of work when there are fewer units than threads.
void R(agi_attn_scratch_alloc)(ag_tape *tp, attn_job *J, bool backward, size_t units);
// The scratch of part `part`.
scratch R(agi_attn_scratch_of)(const attn_job *J, int part, bool backward);
// Slice n's operands in place, in the tensors.
slice_view R(agi_attn_view)(const attn_job *J, size_t n);
// dst[r, :w] = src[r, :w] (add_rows: +=) for `rows` rows, row strides ld_dst and ld_src.
void R(agi_copy_rows)(real *dst, int ld_dst, const real *src, int ld_src, int rows, int w);
void R(agi_add_rows)(real *dst, int ld_dst, const real *src, int ld_src, int rows, int w);
// The masks of block rows [i0, ...) x keys [j0, ...) of slice n, for agi_score_mask.
agi_score_masks R(agi_attn_masks_at)(const attn_job *J, size_t n, int i0, int j0);
// The position bias vector of the job, in tape memory (NULL without a bias).
real *R(agi_attn_rel)(const ag_node *node, const attn_job *J);
// The dropout keep flags of rows [i0, i0 + bq) of slice n, [bq, S].
void R(agi_attn_replay_keep)(const attn_job *J, size_t n, int i0, int bq, uint8_t *keep);

#endif
