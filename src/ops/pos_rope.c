// Rotary positions (RoPE, Su et al. 2021): not a term of the scores but a rotation of q
// and k by their absolute positions (the op ag_rope, rotate_half convention), so that
// q_i . k_j depends on j - i. The fused attention rotates inside, a block at a time
// (ag_attention_opts.rope); the composed path and the KV cache rotate with ag_rope.
#include <math.h>
#include <stdio.h>

#include "pos.h"

static void rope_defaults(agi_pos *p) {
    if (p->p.base == 0) p->p.base = 10000;
}

// Pairs (c, c + d/2): an even head width. The angles t base^(-2c/d) need a finite base > 0.
static bool rope_check(const agi_pos *p, bool every_variant, char *why, size_t size) {
    (void)every_variant;
    if (p->head_dim % 2 != 0) {
        snprintf(why, size, "rotary positions need an even head_dim, got %d", p->head_dim);
        return false;
    }
    if (!(p->p.base > 0 && isfinite(p->p.base))) {
        snprintf(why, size, "rotary positions need a finite rope_base > 0, got %g", p->p.base);
        return false;
    }
    return true;
}

static ag_tensor *rope_rotate(ag_tape *tp, ag_tensor *x, const agi_pos *p, int heads,
                              int offset) {
    const ag_rope_opts o = {.base = p->p.base, .pos_offset = offset, .heads = heads};
    return ag_rope(tp, x, &o);
}

static void rope_inside(const agi_pos *p, ag_attention_opts *o) {
    o->rope = true;
    o->rope_opts.base = p->p.base;
}

const agi_pos_scheme agi_pos_rope = {
    .name = "ROPE",
    .title = "RoPE",
    .defaults = rope_defaults,
    .check = rope_check,
    .rotate = rope_rotate,
    .inside = rope_inside,
};
