// The plumbing of fused attention (src/ops/attention.c): where each slice of each operand
// lives, one call's job shared by the threads, and each thread's scratch. Typed (see
// src/core/real.h): names that differ by type go through R().
#ifndef ATTOGRAD_ATTENTION_JOB_H
#define ATTOGRAD_ATTENTION_JOB_H

#include "../kernels/block_product.h"
#include "../kernels/score_block.h"
#include "../kernels/score_row.h"
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
    int B, h, T, S, d, dv;   // S: the keys in use (k and v may hold more rows, see operand)
    int kvh;                 // heads of k and v: query head i reads kv head i / (h / kvh)
    int qi, ki, vi;          // input index of q, k and v (all 0 when packed)
    operand q, k, v, o;      // o: the output
    agi_scores scores;       // scale, causality, query offset, masks, position term
    double p;  // dropout probability actually applied: 0 when not training
    uint64_t seed, site;
    bool recompute;  // opts recompute_scores
    bool rope;  // q and k rotated by position (ag_rope) inside
    double rope_base;
    int rope_offset;
    ag_autocast products;  // the tape's autocast when recorded: the products' precision
} attention_params;

// Everything one call needs, shared read-only by the threads; per-thread scratch is
// carved out of `scratch` by part.
typedef struct {
    int h, T, S, d, dv;
    int group;      // query heads per kv head, h / kvh: slices n = u*group .. u*group +
                    // group - 1 read kv slice u (n = b*h + head, u = b*kvh + head / group)
    size_t slices;  // B * h
    int bq, bk, ld;  // block sizes; ld = row stride of a score block
    real scale;
    bool causal;
    int q_offset;  // query i sits at position q_offset + i among the keys
    int window;    // > 0: a sliding window (ag_softmax_opts.window)
    const agi_scores *mi;  // how the masks map onto the scores; the position term
    const uint8_t *mask, *kpm;
    const real *add;
    const real *rel;  // position bias by relative position: [h, T + S - 1], or NULL
    double p;  // 0: no dropout
    real keep_scale;  // 1 / (1 - p)
    uint64_t seed, site;
    agi_dropout_plan drop;  // replays the dropout draws of rows of the weights (p > 0)
    operand Lq, Lk, Lv, Lo;  // layouts; the pointers below already include the offsets
    const real *rope;  // RoPE's cos and sin table of the keys' positions [0, rope_T), or
    int rope_T;        // NULL
    const real *rope_q;  // the queries': query i at its row rope_q0 + i of rope_qT rows,
    int rope_qT, rope_q0;  // rope itself when the keys' rows cover them, else (rope_q_apart)
    bool rope_q_apart;     // a table of their own at position pos_offset + q_offset
    bool tiles;  // products through the tile kernels (src/kernels/tile_gemm.h), with a
                 // block of k (and of v) transposed first; else through BLAS
    bool bf16;   // (f32 under autocast) products on bf16 operands (bf16_gemm.h) instead
    bool stage;  // work on contiguous copies of each slice (see forward_slice_staged)
    bool row;    // one query a slice, forward only: the products as dot products on k
                 // and v in place (src/kernels/score_row.h), no transposes, no staging
    const real *q, *k, *v, *o, *dout;
    real *out;
    real *row_max, *row_log_sum;  // per query, for backward's P (see attention.c)
    real *kept;      // the masked scores forward kept for backward, or NULL (see
                     // ATTN_KEEP_KEYS): block (slice n, query block qb, key
                     // block kb) at ((n nqb + qb) nkb + kb) bq ld, rows ld apart, key
                     // blocks counted from the query block's first visible key
    int kept_nqb, kept_nkb;
    real *gq, *gk, *gv, *gadd;
    real **gadd_part;  // per part: where the gradient of an additive mask shared by
                       // slices goes
    real **grel_part;  // per part: the position bias gradient, [h, T + S - 1]
    int parts;
    unsigned char *scratch;
    size_t part_bytes;
} attn_job;

// What the forward saves for backward: the logsumexp of every query [B, h, T], the
// tables backward would otherwise make again (position bias, RoPE's cos and sin), and
// the scores when forward keeps them (ATTN_KEEP_KEYS).
typedef struct {
    real *row_max, *row_log_sum;
    const real *rel, *rope, *rope_q;
    real *kept;
} attn_saved;

// Forward keeps the scores for backward (unless opts recompute_scores) when there are at
// most ATTN_KEEP_KEYS keys, so that memory still grows with T and not T * S, and they
// take at most ATTN_KEEP_BYTES. Kept, backward reads them and takes P = exp(s - m - log l) from
// them; else it makes them again from q and k (a product and the masks), as flash
// attention does. The product and the masks are the same calls on the same operands
// either way, so both give the same bits. Measured in the README ("Benchmarks").
#define ATTN_KEEP_BYTES ((double)(512u << 20))
enum { ATTN_KEEP_KEYS = 1024 };

// One part's scratch: score blocks, per-row statistics, dropout masks of a query block,
// and when staging, contiguous copies of a slice's operands.
typedef struct {
    real *s, *dp;  // [bq, ld] each (dp only in backward, where it holds Pd first)
    real *m;            // running row max (forward)
    double *l, *D;      // running row sum (forward), dO . o (backward)
    uint8_t *keep;      // [bq, S] keep flags when dropout is on
    real *q, *k, *v, *o, *dout, *gq, *gk, *gv;  // staged slice: [T, d], [S, d], [S, dv],
                                                // [T, dv] (o forward, dout backward),
                                                // gq, gk, gv
    real *kt, *vt;  // with tiles: a key block's k^T [d, ldt] and (backward) v^T [dv, ldt]
    int ldt;
    real *qr, *kr;    // with RoPE: a query block [bq, d] and a key block [bk, d] rotated
    real *gqr, *gkr;  // and (backward) their gradients before the inverse rotation
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
// Sizes and carves each part's scratch from tape memory: a part per thread (four when the
// scratch is small), or one per unit of work when there are fewer units.
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
// Forward's tables, in tape memory: the position bias vector (J->rel) and RoPE's cos and
// sin (J->rope, J->rope_q), each when the node has one; when the node records, also each
// query's row max and log of its row sum (J->row_max, J->row_log_sum) and, within ATTN_KEEP_KEYS, room for the scores (J->kept), all
// saved for backward (node->saved, an attn_saved).
void R(agi_attn_tables)(ag_node *node, attn_job *J);
// C = alpha op(A) op(B) + beta C on blocks: through the tile kernels, which read op(B) =
// B^T from its transpose Bt (rows ldbt apart, made by agi_attn_keys), or through BLAS,
// which reads B as it is.
void R(agi_attn_product)(const attn_job *J, bool ta, bool tb, int M, int N, int K, real alpha,
                         const real *A, int lda, const real *B, int ldb, const real *Bt,
                         int ldbt, real beta, real *C, int ldc);
// Queries [i0, i0 + bq) of an operand q (rows ldq apart) as the products take them: in
// place, or rotated into sc->qr with RoPE (at positions q_offset + i); *ld gets their row
// stride.
const real *R(agi_attn_queries)(const attn_job *J, const scratch *sc, const real *q, int ldq,
                                int i0, int bq, int *ld);
// Keys [j0, j0 + bk) likewise (rotated into sc->kr with RoPE), and with tiles (not for
// one row) their transpose in sc->kt when kt is true; values [j0, j0 + bk) of v
// transposed into sc->vt when v is not NULL.
const real *R(agi_attn_keys)(const attn_job *J, const scratch *sc, const real *k, int ldk,
                             const real *v, int ldv, int j0, int bk, bool kt, int *ld);
// Checks RoPE's options for the geometry in *p and records them there (once, type-free).
bool agi_attn_rope_params(const char *op, const ag_rope_opts *o, const agi_about *subject,
                          attention_params *p);
// The dropout keep flags of rows [i0, i0 + bq) of slice n, [bq, S].
void R(agi_attn_replay_keep)(const attn_job *J, size_t n, int i0, int bq, uint8_t *keep);

#endif
