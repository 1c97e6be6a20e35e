// A recorded tape as one self-contained web page (see attograd/tape_html.h).
//
// This file writes the data: every node (op, rule, inputs, output, what its backward sends
// to each input, its check) and every tensor (name, shape, values, gradient), as JSON in
// the page, each number rounded once to the digits asked for and written as text, so the
// page shows exactly these strings. The page itself (style and script) is
// src/io/tape_html.css and src/io/tape_html.js, built into the library as text
// (cmake/embed_text.cmake); the script draws the graph and the panels from the JSON.
//
// Safety: the JSON sits in a <script type="application/json"> element, so every '<', '>'
// and '&' in it is written as \u003c, \u003e, \u0026 (no name can close the element), and
// the script shows names with textContent, never as markup. A Content-Security-Policy
// forbids any request: the page can load nothing, whatever it holds.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/json.h"
#include "../ops/node_replay.h"
#include "atomic_file.h"
#include "attograd/tape_html.h"
#include "tape_html_assets.h"

enum { MAX_FULL_COLS = 8, MAX_CROP = 1024, MAX_DIGITS = 17 };

ag_tape_html_opts ag_tape_html_defaults(void) {
    return (ag_tape_html_opts){.digits = 4, .max_full = 64, .max_rows = 64, .max_cols = 64,
                               .max_nodes = 40};
}

// ---- Output: buffered, into the atomic file ------------------------------------------------

typedef struct {
    agi_atomic_file af;
    char buf[1 << 16];
    size_t len;
    int digits;
} page;

static void flush(page *p) {
    agi_atomic_write(&p->af, p->buf, p->len);
    p->len = 0;
}

static void put_n(page *p, const char *s, size_t n) {
    if (n > sizeof p->buf - p->len) {
        flush(p);
        if (n > sizeof p->buf) {
            agi_atomic_write(&p->af, s, n);
            return;
        }
    }
    memcpy(p->buf + p->len, s, n);
    p->len += n;
}

static void put(page *p, const char *s) { put_n(p, s, strlen(s)); }

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void putf(page *p, const char *fmt, ...) {
    char s[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s, sizeof s, fmt, ap);
    va_end(ap);
    put_n(p, s, n < 0 ? 0 : (size_t)n < sizeof s ? (size_t)n : sizeof s - 1);
}

// A number as the page shows it: `digits` significant digits (MAX_DIGITS for an integer
// tensor's entries: in full), "NaN", "Infinity" or "-Infinity". With '.' whatever the
// locale (agi_format_g): the page's script reads them as JSON.
static void put_number(page *p, double v, int digits) {
    char s[64];
    if (isnan(v))
        snprintf(s, sizeof s, "NaN");
    else if (isinf(v))
        snprintf(s, sizeof s, "%sInfinity", v < 0 ? "-" : "");
    else
        agi_format_g(s, sizeof s, digits, v);
    put(p, s);
}

// A JSON string that is safe inside <script>: agi_json_quote's escapes, and '<', '>', '&'
// as \u escapes. Text that is not valid UTF-8 has each byte above 0x7f replaced by U+FFFD.
static void put_string(page *p, const char *s) {
    if (!s) {
        put(p, "null");
        return;
    }
    size_t n = strlen(s);
    bool utf8 = agi_utf8_valid(s, n);
    char *q = agi_malloc(agi_json_quote(s, NULL) + 1);
    size_t len = agi_json_quote(s, q);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)q[i];
        if (c == '<' || c == '>' || c == '&')
            putf(p, "\\u%04x", c);
        else if (c >= 0x80 && !utf8)
            put(p, "\\ufffd");
        else
            put_n(p, q + i, 1);
    }
    agi_free(q);
}

// Text in HTML (the <title>): & < > " ' as entities; not valid UTF-8 as in put_string.
static void put_html(page *p, const char *s) {
    bool utf8 = agi_utf8_valid(s, strlen(s));
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': put(p, "&amp;"); break;
        case '<': put(p, "&lt;"); break;
        case '>': put(p, "&gt;"); break;
        case '"': put(p, "&quot;"); break;
        case '\'': put(p, "&#39;"); break;
        default:
            if (c >= 0x80 && !utf8)
                put(p, "&#xfffd;");
            else
                put_n(p, s, 1);
        }
    }
}

// ---- Values: a tensor's data, its gradient, or what a node sends ---------------------------

// Entries laid out as tensor t: from `buf` in t's dtype, or from doubles `d`.
typedef struct {
    const ag_tensor *t;
    const void *buf;
    const double *d;
} values;

static double value_at(const values *v, size_t i) {
    return v->d ? v->d[i] : agi_replay_get(v->t, v->buf, i);
}

// An int64 entry as its digits: a double holds only those up to 2^53 (an index, a seed or a
// count beyond shows as itself, not its neighbour).
static const int64_t *i64_entries(const values *v) {
    return !v->d && v->t->dtype == AG_I64 ? (const int64_t *)v->buf : NULL;
}

static void put_entry(page *p, const values *v, size_t i, double x, int digits) {
    const int64_t *q = i64_entries(v);
    if (q)
        putf(p, "%" PRId64, q[i]);
    else
        put_number(p, x, digits);
}

// {"rows":R,"cols":C,"r":r,"c":c,"d":"entries of the first r rows and c columns",
//  "min":..,"max":..,"norm":..,"nan":n,"inf":n}: the tensor as a matrix [rows, last dim],
// in full when small (r = R, c = C), else cropped for a heatmap.
static void put_values(page *p, const values *v, const ag_tape_html_opts *o, bool grad) {
    const ag_tensor *t = v->t;
    double zero_below = grad ? o->zero_below : 0;
    int digits = !agi_is_float(t->dtype) && !v->d ? MAX_DIGITS : p->digits;
    size_t cols = t->ndim ? (size_t)t->shape[t->ndim - 1] : 1, rows = t->numel / cols;
    bool full = t->numel <= (size_t)o->max_full && cols <= MAX_FULL_COLS;
    size_t r = full || rows < (size_t)o->max_rows ? rows : (size_t)o->max_rows;
    size_t c = full || cols < (size_t)o->max_cols ? cols : (size_t)o->max_cols;
    putf(p, "{\"rows\":%zu,\"cols\":%zu,\"r\":%zu,\"c\":%zu,\"full\":%s,\"d\":\"", rows, cols,
         r, c, full ? "true" : "false");
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < c; j++) {
            if (i || j) put(p, " ");
            double x = value_at(v, i * cols + j);
            put_entry(p, v, i * cols + j, fabs(x) < zero_below ? 0 : x, digits);
        }
    // min and max of the entries that are not NaN (an infinity is one); the norm NaN when
    // any entry is, infinite when any is, else summed scaled by the largest magnitude, so
    // that neither 1e300 nor 1e-310 squared leaves the range of a double.
    double lo = INFINITY, hi = -INFINITY, big = 0;
    size_t nan = 0, inf = 0, zeroed = 0;
    for (size_t i = 0; i < t->numel; i++) {
        double x = value_at(v, i);
        if (x != 0 && fabs(x) < zero_below) zeroed++, x = 0;
        if (isnan(x)) {
            nan++;
            continue;
        }
        inf += isinf(x) != 0;
        lo = fmin(lo, x), hi = fmax(hi, x);
        big = fmax(big, fabs(x));
    }
    double norm = nan ? NAN : inf ? INFINITY : 0;
    if (!nan && !inf && big > 0) {
        double sq = 0;
        for (size_t i = 0; i < t->numel; i++) {
            double x = value_at(v, i);
            if (fabs(x) >= zero_below) sq += (x / big) * (x / big);
        }
        norm = big * sqrt(sq);
    }
    put(p, "\",\"min\":\"");
    const int64_t *q = i64_entries(v);
    size_t lo_i = 0, hi_i = 0;
    for (size_t i = 1; q && i < t->numel; i++) {
        if (q[i] < q[lo_i]) lo_i = i;
        if (q[i] > q[hi_i]) hi_i = i;
    }
    put_entry(p, v, lo_i, nan == t->numel ? NAN : lo, digits);
    put(p, "\",\"max\":\"");
    put_entry(p, v, hi_i, nan == t->numel ? NAN : hi, digits);
    put(p, "\",\"norm\":\"");
    put_number(p, norm, p->digits);
    putf(p, "\",\"nan\":%zu,\"inf\":%zu,\"zeroed\":%zu}", nan, inf, zeroed);
}

// ---- The tensors of the tape: node outputs and the leaves they read -----------------------

// A tensor is what agi_tape_leaf says a node's input stands for: a frozen tensor that
// several nodes read through header copies is one tensor, shown as its first read.
typedef struct {
    const ag_tape *tp;
    const ag_tensor **at;  // by id
    int count, cap;
    const ag_tensor **slot;  // open addressing on the pointer, holding id + 1 in ids
    int *ids;
    size_t slots;  // a power of two, at least twice the tensors
} tensor_table;

static size_t slot_of(const tensor_table *tt, const ag_tensor *t) {
    uint64_t h = (uint64_t)(uintptr_t)t * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (tt->slots - 1);
    while (tt->slot[i] && tt->slot[i] != t) i = (i + 1) & (tt->slots - 1);
    return i;
}

static int tensor_id(tensor_table *tt, const ag_tensor *t) {
    const ag_tensor *key = agi_tape_leaf(tt->tp, t);
    size_t i = slot_of(tt, key);
    if (tt->slot[i]) return tt->ids[i] - 1;
    tt->slot[i] = key;
    tt->ids[i] = tt->count + 1;
    tt->at = agi_reserve(tt->at, &tt->cap, tt->count, tt->count + 1, 64, sizeof *tt->at);
    tt->at[tt->count] = t;
    return tt->count++;
}

static void table_init(tensor_table *tt, const ag_tape *tp) {
    memset(tt, 0, sizeof *tt);
    tt->tp = tp;
    size_t most = 1;  // every input and output once
    for (int i = 0; i < ag_tape_num_nodes(tp); i++) most += (size_t)ag_tape_node(tp, i)->n_in + 1;
    tt->slots = 16;
    while (tt->slots < 2 * most) tt->slots *= 2;
    tt->slot = agi_calloc(tt->slots * sizeof *tt->slot);
    tt->ids = agi_calloc(tt->slots * sizeof *tt->ids);
    for (int i = 0; i < ag_tape_num_nodes(tp); i++) {
        const ag_node *nd = ag_tape_node(tp, i);
        for (int k = 0; k < nd->n_in; k++) tensor_id(tt, nd->in[k]);
        tensor_id(tt, nd->out);
    }
}

static void table_free(tensor_table *tt) {
    agi_free(tt->at);
    agi_free(tt->slot);
    agi_free(tt->ids);
}

// The node of tp that made t, or -1 for a leaf (or a tensor another tape made).
static int producer(const ag_tape *tp, const ag_tensor *t) {
    return t->node && t->node->tape == tp ? t->node->index : -1;
}

static void put_tensor(page *p, const ag_tape *tp, const ag_tensor *t,
                       const ag_tape_html_opts *o) {
    char shape[96];
    put(p, "{\"name\":");
    put_string(p, t->name);
    putf(p, ",\"dtype\":\"%s\",\"shape\":\"%s\",\"dims\":[", ag_dtype_name(t->dtype),
         ag_tensor_shape_str(t, shape, sizeof shape));
    for (int d = 0; d < t->ndim; d++) putf(p, "%s%d", d ? "," : "", t->shape[d]);
    putf(p, "],\"node\":%d,\"rg\":%s,\"value\":", producer(tp, t),
         t->requires_grad ? "true" : "false");
    put_values(p, &(values){t, t->data, NULL}, o, false);
    put(p, ",\"grad\":");
    if (t->grad && agi_is_float(t->dtype))
        put_values(p, &(values){t, t->grad, NULL}, o, true);
    else
        put(p, "null");
    put(p, ",\"notes\":[");
    bool first = true;
    for (int i = 0; i < o->n_notes; i++) {
        if (o->notes[i].tensor != agi_tape_leaf(tp, t) || !o->notes[i].text) continue;
        if (!first) put(p, ",");
        put_string(p, o->notes[i].text);
        first = false;
    }
    put(p, "]}");
}

// ---- Nodes ------------------------------------------------------------------------------------

// "ok" is false for a failure only; an inconclusive check says so in "verdict".
static void put_check(page *p, const ag_tape_check_entry *e) {
    const ag_check_result *fd = &e->fd;
    putf(p, "{\"ok\":%s,\"n\":%d,\"elem\":%s,\"f64\":%s,\"runs\":%d,\"nf\":%d,\"small\":%d,",
         fd->verdict != AG_CHECK_FAIL ? "true" : "false", fd->comparisons,
         fd->elementwise ? "true" : "false", e->in_f64 ? "true" : "false", fd->forward_runs,
         fd->not_finite, fd->smaller_steps);
    // Errors with 2 digits, as ag_tape_check_print shows them: their size is what matters.
    put(p, "\"abs\":\"");
    put_number(p, fd->max_abs_err, 2);
    put(p, "\",\"rel\":\"");
    put_number(p, fd->max_rel_err, 2);
    put(p, "\",\"twin\":");
    if (e->f32_vs_f64 >= 0) {
        put(p, "\"");
        put_number(p, e->f32_vs_f64, 2);
        put(p, "\"");
    } else {
        put(p, "null");
    }
    putf(p, ",\"worst\":%d,\"num\":\"", fd->worst_input);
    put_number(p, fd->worst_numeric, p->digits);
    put(p, "\",\"ana\":\"");
    put_number(p, fd->worst_analytic, p->digits);
    put(p, "\",\"note\":");
    put_string(p, fd->reason);
    putf(p, ",\"verdict\":\"%s\"}", ag_check_verdict_name(fd->verdict));
}

// What the node's backward sends to each input, replayed alone (node_replay.h).
static void put_sends(page *p, const ag_node *nd, const ag_tape_html_opts *o) {
    double *sends[AG_MAX_INPUTS] = {0};
    bool diff[AG_MAX_INPUTS] = {0};
    for (int k = 0; k < nd->n_in; k++)
        if (agi_is_float(nd->in[k]->dtype) && nd->in[k]->requires_grad)
            sends[k] = agi_malloc((nd->in[k]->numel ? nd->in[k]->numel : 1) * sizeof *sends[k]);
    double replay = 0;
    bool sent = agi_node_sends(nd, sends, diff, &replay);
    put(p, ",\"sends\":[");
    for (int k = 0; k < nd->n_in; k++) {
        if (k) put(p, ",");
        if (sent && diff[k])
            put_values(p, &(values){nd->in[k], NULL, sends[k]}, o, true);
        else
            put(p, "null");
        agi_free(sends[k]);
    }
    put(p, "],\"replay\":\"");
    put_number(p, sent ? replay : 0, 2);
    putf(p, "\",\"sent\":%s", sent ? "true" : "false");
}

static void put_node(page *p, tensor_table *tt, const ag_node *nd,
                     const ag_tape_html_opts *o) {
    put(p, "{\"op\":");
    put_string(p, nd->op->name ? nd->op->name : "?");
    put(p, ",\"rule\":");
    put_string(p, nd->op->rule);
    put(p, ",\"in\":[");
    for (int k = 0; k < nd->n_in; k++) putf(p, "%s%d", k ? "," : "", tensor_id(tt, nd->in[k]));
    putf(p, "],\"out\":%d", tensor_id(tt, nd->out));
    put_sends(p, nd, o);
    put(p, ",\"check\":");
    if (o->check)
        put_check(p, &o->check->nodes[nd->index]);
    else
        put(p, "null");
    put(p, "}");
}

// ---- Repeated blocks ----------------------------------------------------------------------
// A tape of more than max_nodes nodes is shown with runs of repeated blocks collapsed: the
// period whose back-to-back repeats (the same ops in the same order) cover the most nodes,
// the shortest among equals (4 layers repeat with period L, and with 2 L too). A run can
// be cut at several places (a transformer's layers repeat from the residual add as well
// as from the LayerNorm after it); it is cut where the fewest tensors cross the blocks'
// borders, which is where the model's own layers begin. What is left, if still too much,
// is cut into consecutive chunks.

typedef struct {
    int first, count;  // nodes first .. first + count - 1
    int copy, copies;  // the block's place in its run (1-based), and the run's length; 0 for
                       // a chunk that repeats nothing
    int through;       // the place of the last block in this box: copy, or more when a run
                       // of many blocks shows several to a box
} group;

typedef struct {
    const ag_tape *tp;
    int n;
    int *ops;       // each node's op as a small number: equal names, equal numbers
    int *last_use;  // the last node reading each node's output (-1: none)
    int *seen;      // stamps, to count distinct producers
    int stamp;
} blocks;

// The tensors crossing the borders of nodes [f, f + len): outputs of earlier nodes read
// inside, and outputs read after it.
static int border_cost(blocks *b, int f, int len) {
    int cost = 0;
    b->stamp++;
    for (int i = f; i < f + len; i++) {
        const ag_node *nd = ag_tape_node(b->tp, i);
        for (int k = 0; k < nd->n_in; k++) {
            int p = producer(b->tp, nd->in[k]);
            if (p >= 0 && p < f && b->seen[p] != b->stamp) {
                b->seen[p] = b->stamp;
                cost++;
            }
        }
        cost += b->last_use[i] >= f + len;
    }
    return cost;
}

// The runs of back-to-back copies of period len: regions where every node's op equals the
// op len nodes later, each cut into whole copies where the borders cost least. Records the
// runs (when runs is not NULL) and returns the nodes covered.
static int tandem_runs(blocks *b, int len, group *runs, int *n_runs) {
    const int *ops = b->ops;
    int covered = 0, end = 0, i = 0;  // end: where the last recorded copy ended
    if (n_runs) *n_runs = 0;
    while (i + len < b->n) {
        if (ops[i] != ops[i + len]) {
            i++;
            continue;
        }
        int a = i;
        while (i + len < b->n && ops[i] == ops[i + len]) i++;
        int lo = a > end ? a : end, span = i + len - lo, copies = span / len;
        if (copies < 2) continue;
        int best_shift = 0, best_cost = -1;
        for (int shift = 0; runs && shift <= span - copies * len; shift++) {
            int cost = 0;
            for (int c = 0; c < copies; c++) cost += border_cost(b, lo + shift + c * len, len);
            if (best_cost < 0 || cost < best_cost) best_cost = cost, best_shift = shift;
        }
        if (runs) runs[(*n_runs)++] = (group){lo + best_shift, len, 0, copies, 0};
        covered += copies * len;
        end = lo + best_shift + copies * len;
    }
    return covered;
}

static int find_groups(const ag_tape *tp, int max_nodes, group **out) {
    int n = ag_tape_num_nodes(tp);
    *out = NULL;
    if (n <= max_nodes) return 0;
    blocks b = {tp, n, agi_malloc((size_t)n * sizeof(int)), agi_malloc((size_t)n * sizeof(int)),
                agi_calloc((size_t)n * sizeof(int)), 0};
    for (int i = 0; i < n; i++) {
        const ag_node *nd = ag_tape_node(tp, i);
        b.ops[i] = i;
        for (int j = 0; j < i; j++) {
            const char *x = ag_tape_node(tp, j)->op->name, *y = nd->op->name;
            if (!strcmp(x ? x : "", y ? y : "")) {
                b.ops[i] = b.ops[j];
                break;
            }
        }
        b.last_use[i] = -1;
        for (int k = 0; k < nd->n_in; k++) {
            int p = producer(tp, nd->in[k]);
            if (p >= 0) b.last_use[p] = i;
        }
    }
    int best = 0, best_len = 0;
    for (int len = 2; 2 * len <= n; len++) {
        int covered = tandem_runs(&b, len, NULL, NULL);
        if (covered > best) best = covered, best_len = len;
    }
    group *g = agi_malloc((size_t)n * sizeof *g);
    int count = 0;
    if (best_len) {
        group *runs = agi_malloc((size_t)n * sizeof *runs);
        int n_runs;
        tandem_runs(&b, best_len, runs, &n_runs);
        // Too many blocks for one box each (a recurrent net unrolled over 1000 steps): `per`
        // consecutive blocks to a box, the fewest that bring the blocks' boxes to at most
        // half of max_nodes, leaving the other half for the nodes outside them.
        int budget = max_nodes / 2 > 1 ? max_nodes / 2 : 1, per = 1, most = 0;
        for (int r = 0; r < n_runs; r++) most = runs[r].copies > most ? runs[r].copies : most;
        for (; per < most; per++) {
            int boxes = 0;
            for (int r = 0; r < n_runs; r++) boxes += (runs[r].copies + per - 1) / per;
            if (boxes <= budget) break;
        }
        best = 0;
        for (int r = 0; r < n_runs; r++)
            for (int c = 0; c < runs[r].copies; c += per) {
                int k = runs[r].copies - c < per ? runs[r].copies - c : per;
                g[count++] = (group){runs[r].first + c * best_len, k * best_len, c + 1,
                                     runs[r].copies, c + k};
                best += k * best_len;
            }
        agi_free(runs);
    }
    // Still too many boxes: the nodes outside the blocks in chunks, each at most `size`.
    int outside = n - best, shown = count + outside;
    if (shown > max_nodes && outside > 1) {
        int room = max_nodes - count > 1 ? max_nodes - count : 1;
        int size = (outside + room - 1) / room;
        if (size < 2) size = 2;
        group *all = agi_malloc((size_t)n * sizeof *all);
        int m = 0, next = 0;
        for (int k = 0; k <= count; k++) {
            int stop = k < count ? g[k].first : n;
            while (next < stop) {
                int len = stop - next < size ? stop - next : size;
                if (len > 1) all[m++] = (group){next, len, 0, 0, 0};
                next += len;
            }
            if (k < count) {
                all[m++] = g[k];
                next = g[k].first + g[k].count;
            }
        }
        agi_free(g);
        g = all;
        count = m;
    }
    agi_free(b.ops);
    agi_free(b.last_use);
    agi_free(b.seen);
    if (!count) agi_free(g), g = NULL;
    *out = g;
    return count;
}

// ---- The page -----------------------------------------------------------------------------

static void put_data(page *p, const ag_tape *tp, const ag_tape_html_opts *o) {
    tensor_table tt;
    table_init(&tt, tp);
    int n = ag_tape_num_nodes(tp);
    put(p, "{\"title\":");
    put_string(p, o->title ? o->title : "attograd tape");
    putf(p, ",\"digits\":%d,\"checked\":%s,\"zero_below\":\"", o->digits,
         o->check ? "true" : "false");
    // The threshold as given, not rounded: at 1 digit, 1.5e-12 is no "2e-12" (entries
    // between the two are not shown as 0).
    int exact = p->digits;
    for (char s[64]; exact < MAX_DIGITS; exact++) {
        agi_format_g(s, sizeof s, exact, o->zero_below);
        if (agi_strtod_c(s, NULL) == o->zero_below) break;
    }
    put_number(p, o->zero_below, exact);
    put(p, "\",\"nodes\":[");
    for (int i = 0; i < n; i++) {
        if (i) put(p, ",\n");
        put_node(p, &tt, ag_tape_node(tp, i), o);
    }
    put(p, "],\n\"tensors\":[");
    for (int i = 0; i < tt.count; i++) {
        if (i) put(p, ",\n");
        put_tensor(p, tp, tt.at[i], o);
    }
    put(p, "],\n\"groups\":[");
    group *g;
    int n_groups = find_groups(tp, o->max_nodes, &g);
    for (int i = 0; i < n_groups; i++)
        putf(p, "%s{\"first\":%d,\"count\":%d,\"copy\":%d,\"through\":%d,\"copies\":%d}",
             i ? "," : "", g[i].first, g[i].count, g[i].copy, g[i].through, g[i].copies);
    agi_free(g);
    put(p, "]}");
    table_free(&tt);
}

// A report of another tape with as many nodes would put its verdicts on the wrong nodes:
// each entry names its node's op and ends its shapes with the output's ("... -> [2,4]",
// unless a node of many inputs filled the field first), and they must be this tape's.
static bool report_differs(const ag_tape *tp, const ag_tape_check_report *r, char *why,
                           size_t n) {
    for (int i = 0; i < r->n_nodes; i++) {
        const ag_node *nd = ag_tape_node(tp, i);
        const ag_tape_check_entry *e = &r->nodes[i];
        const char *op = nd->op->name ? nd->op->name : "?";
        char out[64];
        ag_tensor_shape_str(nd->out, out, sizeof out);
        const char *arrow = strstr(e->shapes, "-> ");
        if (e->index == i && e->op && !strcmp(e->op, op) && (!arrow || !strcmp(arrow + 3, out)))
            continue;
        snprintf(why, n, "the check report's node %d is %s %s, the tape's %s -> %s: a report of "
                 "another tape", i, e->op ? e->op : "?", arrow ? arrow : "", op, out);
        return true;
    }
    return false;
}

// The first option out of range, named, with what it got, into `why`; false if none.
static bool opts_wrong(const ag_tape *tp, const ag_tape_html_opts *o, char *why, size_t n) {
    if (o->digits < 1 || o->digits > MAX_DIGITS)
        snprintf(why, n, "digits must be 1 to %d, got %d", MAX_DIGITS, o->digits);
    else if (o->max_full < 0)
        snprintf(why, n, "max_full must be >= 0, got %d", o->max_full);
    else if (o->max_rows < 1 || o->max_rows > MAX_CROP)
        snprintf(why, n, "max_rows must be 1 to %d, got %d", MAX_CROP, o->max_rows);
    else if (o->max_cols < 1 || o->max_cols > MAX_CROP)
        snprintf(why, n, "max_cols must be 1 to %d, got %d", MAX_CROP, o->max_cols);
    else if (o->max_nodes < 1)
        snprintf(why, n, "max_nodes must be >= 1, got %d", o->max_nodes);
    else if (!(o->zero_below >= 0 && o->zero_below < INFINITY))
        snprintf(why, n, "zero_below must be finite and >= 0, got %g", o->zero_below);
    else if (o->n_notes < 0 || (o->n_notes > 0 && !o->notes))
        snprintf(why, n, "%d notes given with notes %s", o->n_notes, o->notes ? "set" : "NULL");
    else if (agi_tape_params_resized(tp, why, n))
        return true;
    else if (o->check && o->check->n_nodes != ag_tape_num_nodes(tp))
        snprintf(why, n, "the check report has %d nodes, the tape %d: a report of another "
                 "tape (or of this one before it grew)", o->check->n_nodes, ag_tape_num_nodes(tp));
    else if (!o->check || !report_differs(tp, o->check, why, n))
        return false;
    return true;
}

int ag_tape_html(const ag_tape *tp, const char *path, const ag_tape_html_opts *opts,
                 ag_err *err) {
    ag_tape_html_opts o = opts ? *opts : ag_tape_html_defaults();
    if (!tp) {
        ag_error("tape_html: the tape is NULL");
        agi_err_set(err, "tape_html: the tape is NULL");
        return -1;
    }
    char why[320];
    if (opts_wrong(tp, &o, why, sizeof why)) {
        ag_error("tape_html: %s", why);
        agi_err_set(err, "tape_html: %s", why);
        return -1;
    }
    page *p = agi_calloc(sizeof *p);
    if (agi_atomic_open(&p->af, path, err)) {
        agi_free(p);
        return -1;
    }
    p->digits = o.digits;
    put(p, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
           "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
           "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n"
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
           "<meta name=\"generator\" content=\"attograd ag_tape_html\">\n<title>");
    put_html(p, o.title ? o.title : "attograd tape");
    put(p, "</title>\n<style>\n");
    put_n(p, (const char *)agi_tape_html_css, agi_tape_html_css_size);
    put(p, "</style>\n</head>\n<body>\n<noscript><p>This page draws the tape with "
           "JavaScript: allow scripts for this file to see it.</p></noscript>\n"
           "<script type=\"application/json\" id=\"tape-data\">");
    put_data(p, tp, &o);
    put(p, "</script>\n<script>\n");
    put_n(p, (const char *)agi_tape_html_js, agi_tape_html_js_size);
    put(p, "</script>\n</body>\n</html>\n");
    flush(p);
    int rc = agi_atomic_commit(&p->af, err);
    agi_free(p);
    return rc;
}
