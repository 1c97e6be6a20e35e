// Position schemes as descriptors: each scheme (relative, T5, ALiBi, RoPE, ...) is one
// file defining one agi_pos_scheme, and the table in pos.c lists them by ag_pos_kind. A
// scheme says what it adds to attention through the hooks below; everything else (the
// softmax and the fused attention computing its term block by block, the composed path,
// a module's table parameter, its checks at init, pruning, the KV cache) is written once,
// for every scheme, on those hooks. Adding a scheme is one file and one table entry.
#ifndef ATTOGRAD_POS_H
#define ATTOGRAD_POS_H

#include <stddef.h>

#include "../core/internal.h"
#include "attograd/ops.h"

// A scheme with its parameters: the op-level ag_pos_bias (kind, table, max_distance,
// num_buckets, bidirectional, heads, dims, base), and what a module knows besides.
typedef struct {
    ag_pos_bias p;
    int head_dim;  // a module's head width d (0 at the op level, where d is the operand's)
} agi_pos;

typedef struct agi_pos_scheme {
    const char *name;   // the kind's name in ag_pos_kind: "T5"
    const char *title;  // in messages: "T5 table ...", "ALiBi takes no table ..."
    // Fills what a module's config leaves 0 with the scheme's defaults (may be NULL).
    void (*defaults)(agi_pos *p);
    // Checks the parameters (the table's shape is checked by pos.c): for the variant
    // p->p.bidirectional asks for, or with every_variant for each one a module may run
    // (causal and not). On failure writes the real constraint, with the values, to why.
    bool (*check)(const agi_pos *p, bool every_variant, char *why, size_t size);
    // A learned table [h, table_cols(p)] (the module's relative_attention_bias.weight),
    // or NULL: none. table_rule says what its columns are, for messages ("2M+1, M = 2").
    int (*table_cols)(const ag_pos_bias *p);
    void (*table_rule)(const ag_pos_bias *p, char *buf, size_t size);
    // The term b(head, r) added to the scaled score of query i and key j, r = j - i: with
    // a table, the column it reads (b = table[head, column(r)]); without, a head's scale
    // times a value of r (b = head_scale(head) value(r), as ALiBi's slopes and the
    // sinusoidal bias's scales are), so that each is computed once per call and not once
    // per head and position. NULL for a scheme that adds no term.
    int (*column)(const ag_pos_bias *p, int r);
    double (*head_scale)(const ag_pos_bias *p, int head);
    double (*value)(const ag_pos_bias *p, int r);
    // A rotation of q and k by absolute position instead (or NULL): as ops, rows at
    // positions offset, offset + 1, ... of x [B, T, heads*d] (the composed path and the KV
    // cache); and inside ag_attention (its options set to do it), which keeps no rotated
    // copies.
    ag_tensor *(*rotate)(ag_tape *tp, ag_tensor *x, const agi_pos *p, int heads, int offset);
    void (*inside)(const agi_pos *p, ag_attention_opts *o);
    // Why pruning heads would change the terms (they follow from h itself), or NULL.
    const char *prune_refusal;
} agi_pos_scheme;

// The scheme of a kind; NULL for a kind no scheme has.
const agi_pos_scheme *agi_pos_scheme_of(ag_pos_kind kind);

// ---- What a module asks (src/nn) ----------------------------------------------------
// p with the scheme's defaults for what is 0.
void agi_pos_defaults(agi_pos *p);
// Everything a module's forward, composed path, cache and pruning could refuse about its
// positions, refused once, at init: the kind, the parameters for every variant, and
// `extra_keys` (add_bias_kv / add_zero_attn, with which no scheme combines). Reports
// "<op>: ..." and returns false.
bool agi_pos_check_module(const char *op, const agi_pos *p, bool extra_keys);
// The columns of the scheme's learned table, 0 when it has none.
int agi_pos_table_cols(const agi_pos *p);
// Why pruning heads is refused (NULL: pruning keeps the terms, its table losing rows).
const char *agi_pos_prune_refusal(const agi_pos *p);
// Attention options that run the scheme inside the fused ag_attention, its table `table`.
void agi_pos_inside(const agi_pos *p, ag_tensor *table, ag_attention_opts *o);
// Outside it: x [B, T, heads*d] rotated by ops at positions offset, offset + 1, ... (x
// itself for a scheme without rotation), and the score term alone, for ag_softmax or an
// ag_attention that rotates nothing (kind NONE for a scheme without a term).
ag_tensor *agi_pos_rotate(ag_tape *tp, const agi_pos *p, ag_tensor *x, int heads, int offset);
ag_pos_bias agi_pos_terms(const agi_pos *p, ag_tensor *table);

// ---- What the ops ask -----------------------------------------------------------------
// The op-level check of opts->pos: a kind with a score term, its parameters for the
// variant asked, its table [heads, cols] of dtype dt (heads, when not 0, is the scores'
// head count) or none. Sets *h to the scheme's head count. Reports "<op>: ...; subject".
bool agi_pos_check_op(const char *op, const ag_pos_bias *p, ag_dtype dt, int heads,
                      const agi_about *subject, int *h);

#endif
