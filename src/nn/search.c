// Sequence search: greedy, sampling and beam search over a model's next-token scores,
// for a batch of inputs (the definitions are in attograd/generate.h).
//
// Live hypotheses are rows 0 .. n-1 of `tok` [batch * K, width], grouped by input in
// input order, each with its sum of log-probabilities `cum` and its input `src`. A step
// asks the model for the scores of every live row, turns each row into log-probabilities
// (its log-sum-exp `lse`), and selects the next live rows into the *_next buffers: row j
// continues old row from[j]. The buffers then swap, and the model is told the mapping
// when it is not the identity. Finished hypotheses go to each input's pool of its K best.
// Everything is allocated in ag_search_new: a run allocates nothing.
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "attograd/generate.h"
#include "nn.h"

typedef struct candidate {
    double sum;  // the continuation's sum of log-probabilities
    int row;     // the live row it continues
    int token;
    long flat;   // (beam within its input) * vocab + token: the order of equal sums
} candidate;

struct ag_search {
    ag_search_config cfg;
    int batch, vocab, start_len, width;  // width = start_len + max_new_tokens
    int beams;                           // K, 1 without beam search
    int n;                               // live rows
    int32_t *tok, *tok_next;             // [batch * K, width]
    double *cum, *cum_next;              // [batch * K]
    int *src, *src_next;                 // [batch * K]
    int *from;                           // [batch * K]
    double *lse;                         // [batch * K]: each live row's log-sum-exp
    bool *done;                          // [batch]
    candidate *cand;                     // [2K]: one input's best continuations
    // Each input's finished hypotheses, at most K: score, sum, generated length,
    // arrival order (ties keep the earlier first) and tokens [max_new_tokens].
    int *pool_n;                                  // [batch]
    double *pool_score, *pool_sum;                // [batch * K]
    int *pool_len;                                // [batch * K]
    long *pool_seq;                               // [batch * K]
    int32_t *pool_tok;                            // [batch * K, max_new_tokens]
    long arrivals;
    ag_sampler *sampler;                          // without beams
    // A run is going on: one started from its step or reorder (or from another thread
    // meanwhile) would refill the hypotheses the running one is reading, and free would
    // take them from under it.
    atomic_bool running;
};

void ag_search_free(ag_search *s) {
    if (!s) return;
    if (atomic_load(&s->running)) {
        ag_error("search_free: the search is running (called from its model's step or "
                 "reorder): not freed; free it after ag_search_run returns");
        return;
    }
    agi_free(s->tok), agi_free(s->tok_next), agi_free(s->cum), agi_free(s->cum_next);
    agi_free(s->src), agi_free(s->src_next), agi_free(s->from), agi_free(s->lse);
    agi_free(s->done), agi_free(s->cand), agi_free(s->pool_n), agi_free(s->pool_score);
    agi_free(s->pool_sum), agi_free(s->pool_len), agi_free(s->pool_seq), agi_free(s->pool_tok);
    ag_sampler_free(s->sampler);
    agi_free(s);
}

ag_search *ag_search_new(int batch, int vocab, int start_len, const ag_search_config *cfg) {
    if (!agi_given(cfg, "search", "config")) return NULL;
    if (batch < 1 || vocab < 1 || start_len < 1 || cfg->max_new_tokens < 1 ||
        cfg->num_beams < 0 || cfg->end_token >= vocab) {
        ag_error("search: needs batch, vocab, start_len and max_new_tokens >= 1, num_beams >= 0 "
                 "and end_token < vocab; got batch %d, vocab %d, start_len %d, max_new_tokens "
                 "%d, num_beams %d, end_token %d",
                 batch, vocab, start_len, cfg->max_new_tokens, cfg->num_beams, cfg->end_token);
        return NULL;
    }
    const int K = cfg->num_beams > 1 ? cfg->num_beams : 1;
    const int R = cfg->num_return ? cfg->num_return : 1;
    if (R < 1 || R > K) {
        ag_error("search: num_return %d must be in [1, %d] (num_beams %d)", cfg->num_return, K,
                 cfg->num_beams);
        return NULL;
    }
    if (!isfinite(cfg->length_penalty) || cfg->stop < AG_BEAM_STOP_HEURISTIC ||
        cfg->stop > AG_BEAM_STOP_NEVER) {
        ag_error("search: length_penalty %g must be finite and stop %d a known rule",
                 cfg->length_penalty, (int)cfg->stop);
        return NULL;
    }
    // n^length_penalty for n up to max_new_tokens, or 1 / it: beyond double's range every
    // score came out as -0, -inf or NaN, and the ranking of hypotheses was lost.
    if (!isfinite(pow((double)cfg->max_new_tokens, fabs(cfg->length_penalty)))) {
        ag_error("search: length_penalty %g: n^length_penalty is beyond double's range for "
                 "n up to max_new_tokens %d",
                 cfg->length_penalty, cfg->max_new_tokens);
        return NULL;
    }
    // Ignored with beams but for temperature (refused), yet held to the sampler's ranges.
    if (K > 1 && !agi_sample_config_ok("search", vocab, &cfg->sample)) return NULL;
    if (K > 1 && cfg->sample.temperature != 0) {
        ag_error("search: beam search does not sample: temperature %g needs num_beams <= 1",
                 cfg->sample.temperature);
        return NULL;
    }
    // Sizes: rows * width tokens, as many for the pools; K * vocab candidates an input.
    size_t rows, tokens, flat;
    if (start_len > INT_MAX - cfg->max_new_tokens || K > INT_MAX / 2 ||  // 2 K candidates
        !agi_size_mul((size_t)batch, (size_t)K, &rows) || rows > (size_t)INT_MAX ||
        !agi_size_mul(rows, (size_t)(start_len + cfg->max_new_tokens) * sizeof(int32_t),
                      &tokens) ||
        !agi_size_mul((size_t)K, (size_t)vocab, &flat)) {
        ag_error("search: batch %d by num_beams %d hypotheses of %d + %d tokens is too large",
                 batch, K, start_len, cfg->max_new_tokens);
        return NULL;
    }
    ag_sampler *sampler = NULL;
    if (K == 1 && !(sampler = ag_sampler_new(vocab, &cfg->sample, cfg->seed, cfg->stream)))
        return NULL;
    ag_search *s = agi_calloc(sizeof *s);
    atomic_init(&s->running, false);
    s->cfg = *cfg;
    s->cfg.num_return = R;
    s->batch = batch, s->vocab = vocab, s->start_len = start_len, s->beams = K;
    s->width = start_len + cfg->max_new_tokens;
    s->sampler = sampler;
    s->tok = agi_malloc(tokens), s->tok_next = agi_malloc(tokens);
    s->cum = agi_malloc(rows * sizeof(double)), s->cum_next = agi_malloc(rows * sizeof(double));
    s->src = agi_malloc(rows * sizeof(int)), s->src_next = agi_malloc(rows * sizeof(int));
    s->from = agi_malloc(rows * sizeof(int));
    s->lse = agi_malloc(rows * sizeof(double));
    s->done = agi_malloc((size_t)batch * sizeof(bool));
    s->cand = agi_malloc(2 * (size_t)K * sizeof *s->cand);
    s->pool_n = agi_malloc((size_t)batch * sizeof(int));
    s->pool_score = agi_malloc(rows * sizeof(double));
    s->pool_sum = agi_malloc(rows * sizeof(double));
    s->pool_len = agi_malloc(rows * sizeof(int));
    s->pool_seq = agi_malloc(rows * sizeof(long));
    s->pool_tok = agi_malloc(rows * (size_t)cfg->max_new_tokens * sizeof(int32_t));
    return s;
}

// sum / n^alpha, the score of a hypothesis of n generated tokens.
static double score_of(const ag_search *s, double sum, int n) {
    return sum / pow((double)n, s->cfg.length_penalty);
}

// Offers input b a finished hypothesis: the generated part of `tokens` (n tokens). It
// takes one of the input's K places if there is one free, or the worst one's if it
// scores strictly better.
static void pool_add(ag_search *s, int b, const int32_t *tokens, int n, double sum) {
    const int K = s->beams, M = s->cfg.max_new_tokens;
    const double score = score_of(s, sum, n);
    int slot = s->pool_n[b];
    if (slot == K) {
        slot = -1;  // the worst: lowest score, the later arrival among equals
        for (int i = 0; i < K; i++) {
            const int p = b * K + i;
            if (slot < 0 || s->pool_score[p] < s->pool_score[b * K + slot] ||
                (s->pool_score[p] == s->pool_score[b * K + slot] &&
                 s->pool_seq[p] > s->pool_seq[b * K + slot]))
                slot = i;
        }
        if (!(score > s->pool_score[b * K + slot])) return;
    } else {
        s->pool_n[b]++;
    }
    const int p = b * K + slot;
    s->pool_score[p] = score, s->pool_sum[p] = sum, s->pool_len[p] = n;
    s->pool_seq[p] = s->arrivals++;
    memcpy(s->pool_tok + (size_t)p * M, tokens, (size_t)n * sizeof(int32_t));
}

// Whether input b, holding K finished hypotheses, can stop after a step whose best
// continuation summed `best` over t generated tokens (Hugging Face's is_done).
static bool input_done(const ag_search *s, int b, double best, int t) {
    const int K = s->beams;
    if (s->pool_n[b] < K) return false;
    if (s->cfg.stop == AG_BEAM_STOP_EARLY) return true;
    double worst = INFINITY;
    for (int i = 0; i < K; i++) worst = fmin(worst, s->pool_score[b * K + i]);
    const int n = s->cfg.stop == AG_BEAM_STOP_NEVER && s->cfg.length_penalty > 0
                      ? s->cfg.max_new_tokens
                      : t;
    return worst >= score_of(s, best, n);
}

// Row i's next live copy with `token` appended: row j of the next buffers.
static void extend(ag_search *s, int j, int i, int len, int32_t token, double sum) {
    memcpy(s->tok_next + (size_t)j * s->width, s->tok + (size_t)i * s->width,
           (size_t)len * sizeof(int32_t));
    s->tok_next[(size_t)j * s->width + len] = token;
    s->cum_next[j] = sum;
    s->src_next[j] = s->src[i];
    s->from[j] = i;
}

static double score_at(const ag_tensor *z, int row, int token) {
    const size_t i = (size_t)row * (size_t)z->shape[1] + (size_t)token;
    return z->dtype == AG_F32 ? ((const float *)z->data)[i] : ((const double *)z->data)[i];
}

// Whether candidate a ranks before candidate b: the larger sum, then the lower flat index.
static bool before(const candidate *a, const candidate *b) {
    return a->sum > b->sum || (a->sum == b->sum && a->flat < b->flat);
}

// Without beams: each live row draws its next token; a row that draws the end token, or
// reaches max_new_tokens, finishes. Returns the number of next live rows.
static int select_sampled(ag_search *s, const ag_tensor *z, int len, int t) {
    int next = 0;
    for (int i = 0; i < s->n; i++) {
        const int token = ag_sampler_next(s->sampler, z, (size_t)i);
        if (token < 0) return -1;
        const double sum = s->cum[i] + score_at(z, i, token) - s->lse[i];
        extend(s, next, i, len, token, sum);
        const int32_t *generated = s->tok_next + (size_t)next * s->width + s->start_len;
        if (token == s->cfg.end_token || t == s->cfg.max_new_tokens) {
            pool_add(s, s->src[i], generated, t, sum);
            s->done[s->src[i]] = true;
        } else {
            next++;
        }
    }
    return next;
}

// Beam search: for each input, its 2K best continuations, finished or kept in order
// (see generate.h). Returns the number of next live rows.
static int select_beams(ag_search *s, const ag_tensor *z, int len, int t) {
    const int K = s->beams, V = s->vocab;
    int next = 0;
    for (int r0 = 0; r0 < s->n;) {
        const int b = s->src[r0];
        int r1 = r0;
        while (r1 < s->n && s->src[r1] == b) r1++;
        // The best min(2K, live * V) continuations, kept sorted by insertion.
        const long all = (long)(r1 - r0) * V;
        const int cap = all < 2L * K ? (int)all : 2 * K;
        int have = 0;
        for (int r = r0; r < r1; r++) {
            for (int v = 0; v < V; v++) {
                candidate c = {s->cum[r] + score_at(z, r, v) - s->lse[r], r, v,
                               (long)(r - r0) * V + v};
                if (have == cap && !before(&c, &s->cand[cap - 1])) continue;
                int at = have < cap ? have++ : cap - 1;
                while (at > 0 && before(&c, &s->cand[at - 1])) {
                    s->cand[at] = s->cand[at - 1];
                    at--;
                }
                s->cand[at] = c;
            }
        }
        const int first = next;
        for (int rank = 0; rank < have && next - first < K; rank++) {
            const candidate *c = &s->cand[rank];
            if (c->token == s->cfg.end_token) {
                if (rank >= K) continue;  // not among the K best: dropped
                const int32_t *row = s->tok + (size_t)c->row * s->width;
                int32_t *scratch = s->tok_next + (size_t)next * s->width;  // free until used
                memcpy(scratch, row + s->start_len, (size_t)(t - 1) * sizeof(int32_t));
                scratch[t - 1] = c->token;
                pool_add(s, b, scratch, t, c->sum);
            } else {
                extend(s, next++, c->row, len, c->token, c->sum);
            }
        }
        if (have > 0 && input_done(s, b, s->cand[0].sum, t)) {
            s->done[b] = true;
            next = first;  // its new beams go no further
        }
        r0 = r1;
    }
    return next;
}

// Each live row's log-sum-exp over the vocabulary, refusing a NaN and a row with no
// finite score.
static bool row_lse(ag_search *s, const ag_tensor *z) {
    for (int i = 0; i < s->n; i++) {
        double m = -INFINITY;
        for (int v = 0; v < s->vocab; v++) {
            const double x = score_at(z, i, v);
            if (isnan(x)) {
                ag_error("search: row %d of the step's scores %s holds a NaN", i, agi_shape(z));
                return false;
            }
            m = fmax(m, x);
        }
        if (m == INFINITY) {  // log_softmax: inf - inf, NaN (torch.log_softmax's too)
            ag_error("search: row %d of the step's scores %s holds +inf: its "
                     "log-probabilities are NaN",
                     i, agi_shape(z));
            return false;
        }
        if (m == -INFINITY) {
            ag_error("search: row %d of the step's scores %s has no finite score", i,
                     agi_shape(z));
            return false;
        }
        double sum = 0;
        for (int v = 0; v < s->vocab; v++) sum += exp(score_at(z, i, v) - m);
        s->lse[i] = m + log(sum);
    }
    return true;
}

static bool run(ag_search *s, const ag_search_model *m, const int32_t *start, int32_t *out,
                int *lengths, double *scores) {
    const int B = s->batch, K = s->beams, M = s->cfg.max_new_tokens;
    for (size_t i = 0; i < (size_t)B * (size_t)s->start_len; i++) {
        if (start[i] < 0 || start[i] >= s->vocab) {
            ag_error("search_run: start token %d at %zu is outside [0, %d)", start[i], i,
                     s->vocab);
            return false;
        }
    }
    for (int b = 0; b < B; b++) {
        memcpy(s->tok + (size_t)b * s->width, start + (size_t)b * s->start_len,
               (size_t)s->start_len * sizeof(int32_t));
        s->cum[b] = 0, s->src[b] = b, s->done[b] = false, s->pool_n[b] = 0;
    }
    s->n = B;
    s->arrivals = 0;
    bool ok = true;
    for (int t = 1; t <= M && s->n > 0; t++) {
        const int len = s->start_len + t - 1;
        const ag_search_hyps h = {s->n, len, s->tok, s->width, s->src};
        const ag_tensor *z = m->step(m->model, &h);
        if (!z) {
            ok = false;
            break;
        }
        if (z->ndim != 2 || z->shape[0] != s->n || z->shape[1] != s->vocab ||
            (z->dtype != AG_F32 && z->dtype != AG_F64)) {
            ag_error("search_run: the step gave %s %s, expected f32 or f64 [%d,%d]",
                     ag_dtype_name(z->dtype), agi_shape(z), s->n, s->vocab);
            ok = false;
            break;
        }
        if (!z->data) {  // a gradient's view no backward has reached: nothing to read
            ag_error("search_run: the step gave scores %s without data (a gradient view no "
                     "backward has reached)",
                     agi_shape(z));
            ok = false;
            break;
        }
        if (!row_lse(s, z)) {
            ok = false;
            break;
        }
        const int next = K > 1 ? select_beams(s, z, len, t) : select_sampled(s, z, len, t);
        if (next < 0) {
            ok = false;
            break;
        }
        bool moved = false;
        for (int j = 0; j < next; j++) moved |= s->from[j] != j;
        int32_t *tk = s->tok;
        double *cu = s->cum;
        int *sr = s->src;
        s->tok = s->tok_next, s->tok_next = tk;
        s->cum = s->cum_next, s->cum_next = cu;
        s->src = s->src_next, s->src_next = sr;
        s->n = next;
        if (moved && next > 0 && t < M && m->reorder && !m->reorder(m->model, s->from, next)) {
            ok = false;
            break;
        }
    }
    // At max_new_tokens the live beams are finished by their length.
    for (int i = 0; ok && i < s->n; i++)
        if (!s->done[s->src[i]])
            pool_add(s, s->src[i], s->tok + (size_t)i * s->width + s->start_len, M, s->cum[i]);
    // Each input's best num_return, by score, the earlier arrival first among equals.
    const int R = s->cfg.num_return;
    for (int b = 0; b < B; b++) {
        int *taken = s->from;  // free after the last step: K flags
        for (int i = 0; i < K; i++) taken[i] = 0;
        for (int r = 0; r < R; r++) {
            const size_t o = (size_t)b * R + (size_t)r;
            int best = -1;
            for (int i = 0; ok && i < s->pool_n[b]; i++) {
                const int p = b * K + i, q = b * K + best;
                if (!taken[i] && (best < 0 || s->pool_score[p] > s->pool_score[q] ||
                                  (s->pool_score[p] == s->pool_score[q] &&
                                   s->pool_seq[p] < s->pool_seq[q])))
                    best = i;
            }
            for (int i = 0; i < M; i++) out[o * M + i] = -1;
            if (lengths) lengths[o] = 0;
            if (scores) scores[o] = -INFINITY;
            if (best < 0) continue;
            taken[best] = 1;
            const int p = b * K + best;
            memcpy(out + o * M, s->pool_tok + (size_t)p * M, (size_t)s->pool_len[p] * sizeof(int32_t));
            if (lengths) lengths[o] = s->pool_len[p];
            if (scores) scores[o] = s->pool_score[p];
        }
    }
    return ok;
}

bool ag_search_run(ag_search *s, const ag_search_model *m, const int32_t *start, int32_t *out,
                   int *lengths, double *scores) {
    if (!s || !m || !m->step || !start || !out) {
        ag_error("search_run: needs a search, a model with a step, start tokens and out");
        return false;
    }
    if (atomic_exchange(&s->running, true)) {
        ag_error("search_run: the search is already running (called from its model's step or "
                 "reorder, or from another thread): one run at a time");
        return false;
    }
    const bool ok = run(s, m, start, out, lengths, scores);
    atomic_store(&s->running, false);
    return ok;
}
