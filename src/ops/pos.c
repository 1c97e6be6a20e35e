// The table of position schemes (see pos.h), and everything about a scheme that is the
// same for every scheme: the checks, a module's questions, the options that run it.
#include "pos.h"

#include <stdio.h>
#include <string.h>

#include "op.h"

extern const agi_pos_scheme agi_pos_relative, agi_pos_t5, agi_pos_alibi, agi_pos_rope,
    agi_pos_sinusoidal;

// No positions inside the attention: no term, no rotation.
static const agi_pos_scheme none = {.name = "NONE", .title = "no positions"};

static const agi_pos_scheme *const schemes[] = {
    [AG_POS_NONE] = &none,
    [AG_POS_RELATIVE] = &agi_pos_relative,
    [AG_POS_T5] = &agi_pos_t5,
    [AG_POS_ALIBI] = &agi_pos_alibi,
    [AG_POS_ROPE] = &agi_pos_rope,
    [AG_POS_SINUSOIDAL] = &agi_pos_sinusoidal,
};
enum { N_SCHEMES = sizeof schemes / sizeof schemes[0] };

const agi_pos_scheme *agi_pos_scheme_of(ag_pos_kind kind) {
    return (int)kind >= 0 && (int)kind < N_SCHEMES ? schemes[kind] : NULL;
}

const char *ag_pos_kind_name(ag_pos_kind kind) {
    const agi_pos_scheme *s = agi_pos_scheme_of(kind);
    return s ? s->name : NULL;
}

static bool has_term(const agi_pos_scheme *s) { return s->column || s->value; }

void agi_pos_defaults(agi_pos *p) {
    const agi_pos_scheme *s = agi_pos_scheme_of(p->p.kind);
    if (s && s->defaults) s->defaults(p);
}

bool agi_pos_check_module(const char *op, const agi_pos *p, bool extra_keys) {
    const agi_pos_scheme *s = agi_pos_scheme_of(p->p.kind);
    if (!s) {
        ag_error("%s: unknown position scheme %d", op, (int)p->p.kind);
        return false;
    }
    if (s != &none && extra_keys) {
        ag_error("%s: positions do not combine with add_bias_kv or add_zero_attn", op);
        return false;
    }
    char why[200];
    if (s->check && !s->check(p, true, why, sizeof why)) {
        ag_error("%s: %s", op, why);
        return false;
    }
    return true;
}

int agi_pos_table_cols(const agi_pos *p) {
    const agi_pos_scheme *s = agi_pos_scheme_of(p->p.kind);
    return s && s->table_cols ? s->table_cols(&p->p) : 0;
}

const char *agi_pos_prune_refusal(const agi_pos *p) {
    const agi_pos_scheme *s = agi_pos_scheme_of(p->p.kind);
    return s ? s->prune_refusal : NULL;
}

void agi_pos_inside(const agi_pos *p, ag_tensor *table, ag_attention_opts *o) {
    const agi_pos_scheme *s = agi_pos_scheme_of(p->p.kind);
    if (s && s->inside) s->inside(p, o);
    o->softmax.pos = agi_pos_terms(p, table);
}

ag_tensor *agi_pos_rotate(ag_tape *tp, const agi_pos *p, ag_tensor *x, int heads, int offset) {
    const agi_pos_scheme *s = agi_pos_scheme_of(p->p.kind);
    return s && s->rotate && x ? s->rotate(tp, x, p, heads, offset) : x;
}

ag_pos_bias agi_pos_terms(const agi_pos *p, ag_tensor *table) {
    const agi_pos_scheme *s = agi_pos_scheme_of(p->p.kind);
    ag_pos_bias b = {0};
    if (s && has_term(s)) {
        b = p->p;
        b.table = s->table_cols ? table : NULL;
    }
    return b;
}

// The kinds with a score term, by name, for a message: "RELATIVE, T5 or ALIBI".
static void term_names(char *buf, size_t size) {
    int n = 0, k = 0;
    for (int i = 0; i < N_SCHEMES; i++) n += has_term(schemes[i]);
    buf[0] = '\0';
    for (int i = 0; i < N_SCHEMES; i++) {
        if (!has_term(schemes[i])) continue;
        const size_t at = strlen(buf);
        snprintf(buf + at, size - at, "%s%s", k == 0 ? "" : k + 1 < n ? ", " : " or ",
                 schemes[i]->name);
        k++;
    }
}

bool agi_pos_check_op(const char *op, const ag_pos_bias *p, ag_dtype dt, int heads,
                      const agi_about *subject, int *h) {
    const agi_pos_scheme *s = agi_pos_scheme_of(p->kind);
    *h = heads;
    if (s == &none) return true;
    if (!s || !has_term(s)) {
        char names[120];
        term_names(names, sizeof names);
        ag_error("%s: pos kind %d is not a bias inside the softmax (%s; ROPE is the op "
                 "ag_rope); %s",
                 op, (int)p->kind, names, agi_about_text(subject));
        return false;
    }
    const agi_pos full = {.p = *p};
    char why[200] = "";
    const bool params_ok = !s->check || s->check(&full, false, why, sizeof why);
    const ag_tensor *t = p->table;
    if (s->table_cols) {
        const int cols = s->table_cols(p);
        if (!t || !params_ok || t->ndim != 2 || t->shape[1] != cols ||
            (heads && t->shape[0] != heads) || t->dtype != dt) {
            char rule[120];
            s->table_rule(p, rule, sizeof rule);
            ag_error("%s: %s table %s must be %s [%s, %d] (%s); %s", op, s->title,
                     agi_dtype_shape(t), ag_dtype_name(dt), heads ? "h" : "heads", cols,
                     rule, agi_about_text(subject));
            return false;
        }
        *h = t->shape[0];
        return true;
    }
    if (t || p->heads < 1 || (heads && p->heads != heads)) {
        ag_error("%s: %s takes no table and pos heads = h >= 1, got heads %d%s%s; %s", op,
                 s->title, p->heads, t ? " and a table " : "", t ? agi_shape(t) : "",
                 agi_about_text(subject));
        return false;
    }
    if (!params_ok) {
        ag_error("%s: %s; %s", op, why, agi_about_text(subject));
        return false;
    }
    *h = p->heads;
    return true;
}
