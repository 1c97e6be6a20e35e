// Sequence search (ag_search, attograd/generate.h): beam search and greedy search
// against an independent implementation of the same definition on fixed scores,
// batching, the reorder contract, allocation, sampling and refusals.
#include <stdlib.h>

#include "testing.h"

#include "reference/search_reference.h"

// ---- A model of fixed scores -------------------------------------------------------------
// The next-token scores after (input b, tokens) of tests/pytorch/make_search_reference.py:
// a hash of b and the tokens spread into [-4, 4), and the end token raised by 0.5 per
// generated token minus 1.
static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static void fixed_scores(int b, const int32_t *tokens, int len, int start_len, int end, int V,
                         double *z) {
    uint64_t h = 0xCBF29CE484222325ULL;
    h = (h ^ (uint64_t)(b + 1)) * 0x100000001B3ULL;
    for (int i = 0; i < len; i++) h = (h ^ (uint64_t)(tokens[i] + 1)) * 0x100000001B3ULL;
    for (int v = 0; v < V; v++) {
        uint64_t x = splitmix64(h + (uint64_t)v * 0x9E3779B97F4A7C15ULL);
        z[v] = (double)(x >> 11) * 0x1p-53 * 8.0 - 4.0;
    }
    if (end >= 0) z[end] += 0.5 * (len - start_len) - 1.0;
}

enum { MAX_ROWS = 64, MAX_V = 16 };

typedef struct fixed_model {
    int vocab, start_len, end;
    int source_offset;           // input b of this search is input b + offset of the scores
    ag_tensor *rows[MAX_ROWS + 1];  // rows[n]: f64 [n, vocab], made once
    // The model's own state per hypothesis, kept by reorder and its own appends: what
    // a KV cache would hold. Checked against the search's view at every step.
    bool stateful;
    int32_t state[MAX_ROWS][32];
    int state_len, state_n;
    bool state_ok;
    int reorders, steps;
    uint64_t allocs_at_step[64];
    int nan_at_step;              // > 0: that step's row 0 holds a NaN
} fixed_model;

static void fixed_model_init(fixed_model *f, int vocab, int start_len, int end) {
    memset(f, 0, sizeof *f);
    f->vocab = vocab, f->start_len = start_len, f->end = end;
    for (int n = 1; n <= MAX_ROWS; n++) f->rows[n] = ag_tensor_zeros(AG_F64, 2, (int[]){n, vocab});
    f->state_ok = true;
}

static void fixed_model_free(fixed_model *f) {
    for (int n = 1; n <= MAX_ROWS; n++) ag_tensor_free(f->rows[n]);
}

static ag_tensor *fixed_step(void *model, const ag_search_hyps *h) {
    fixed_model *f = model;
    if (f->steps < 64) f->allocs_at_step[f->steps] = ag_memory_usage().allocations;
    f->steps++;
    if (f->stateful) {
        if (f->state_len == 0) {  // the first step: every hypothesis holds the start tokens
            for (int i = 0; i < h->n; i++)
                memcpy(f->state[i], h->tokens + (size_t)i * h->stride,
                       (size_t)h->len * sizeof(int32_t));
        } else {
            // The rows kept their places (or were reordered): append each last token.
            f->state_ok &= h->len == f->state_len + 1 && h->n <= f->state_n;
            for (int i = 0; i < h->n; i++)
                f->state[i][h->len - 1] = h->tokens[(size_t)i * h->stride + h->len - 1];
        }
        f->state_len = h->len, f->state_n = h->n;
        for (int i = 0; i < h->n; i++)
            f->state_ok &= memcmp(f->state[i], h->tokens + (size_t)i * h->stride,
                                  (size_t)h->len * sizeof(int32_t)) == 0;
    }
    ag_tensor *z = f->rows[h->n];
    for (int i = 0; i < h->n; i++)
        fixed_scores(h->source[i] + f->source_offset, h->tokens + (size_t)i * h->stride, h->len,
                     f->start_len, f->end, f->vocab, (double *)z->data + (size_t)i * f->vocab);
    if (f->nan_at_step == f->steps) ((double *)z->data)[0] = NAN;
    return z;
}

static bool fixed_reorder(void *model, const int *from, int n) {
    fixed_model *f = model;
    int32_t copy[MAX_ROWS][32];
    memcpy(copy, f->state, sizeof copy);
    for (int i = 0; i < n; i++) memcpy(f->state[i], copy[from[i]], sizeof copy[0]);
    f->state_n = n;
    f->reorders++;
    return true;
}

static ag_search_config config_of(const search_ref *r) {
    return (ag_search_config){.max_new_tokens = r->max_new, .end_token = r->end,
                              .num_beams = r->beams, .num_return = r->num_return,
                              .length_penalty = r->alpha, .stop = r->stop};
}

// What a run returns: batch * num_return hypotheses.
typedef struct results {
    int32_t out[SEARCH_REF_MAX_OUT * SEARCH_REF_MAX_NEW];
    int lengths[SEARCH_REF_MAX_OUT];
    double scores[SEARCH_REF_MAX_OUT];
} results;

// Runs reference case r on model f into *res.
static bool run_case_on(const search_ref *r, fixed_model *f, results *res) {
    ag_search_config cfg = config_of(r);
    ag_search *s = ag_search_new(r->batch, r->vocab, r->start_len, &cfg);
    int32_t start[3 * SEARCH_REF_MAX_START];
    for (int b = 0; b < r->batch; b++)
        for (int i = 0; i < r->start_len; i++) start[b * r->start_len + i] = r->start[b][i];
    ag_search_model m = {fixed_step, f->stateful ? fixed_reorder : NULL, f};
    bool ok = s && ag_search_run(s, &m, start, res->out, res->lengths, res->scores);
    ag_search_free(s);
    return ok;
}

// The same on a fresh model of r's scores, with or without state.
static bool run_case(const search_ref *r, bool stateful, fixed_model *f, results *res) {
    fixed_model_init(f, r->vocab, r->start_len, r->end);
    f->stateful = stateful;
    return run_case_on(r, f, res);
}

static const int n_cases = (int)(sizeof search_refs / sizeof search_refs[0]);

static void check_against_reference(bool beams) {
    int checked = 0;
    for (int c = 0; c < n_cases; c++) {
        const search_ref *r = &search_refs[c];
        if ((r->beams > 1) != beams) continue;
        fixed_model f;
        results res;
        CHECK(run_case(r, false, &f, &res));
        for (int i = 0; i < r->batch * r->num_return; i++) {
            bool same = res.lengths[i] == r->lengths[i];
            for (int t = 0; t < r->max_new; t++)
                same &= res.out[i * r->max_new + t] == r->tokens[i][t];
            if (!same) fprintf(stderr, "  case %s, hypothesis %d differs\n", r->name, i);
            CHECK(same);
            CHECK_NEAR(res.scores[i], r->scores[i], 1e-12);
        }
        checked++;
        fixed_model_free(&f);
    }
    CHECK(checked >= 2);
}

static void test_beam_search_matches_the_independent_reference(void) {
    check_against_reference(true);
}

static void test_greedy_search_matches_the_independent_reference(void) {
    check_against_reference(false);
}

// ---- Against brute force ------------------------------------------------------------------
// With K at least vocab^max_new, no continuation is ever cut: every end token ranks among
// the first K, every other continuation stays live, and the K places of the pool hold
// every finished hypothesis (so no stopping rule can stop an input early). Beam search
// then returns every hypothesis there is, ranked by sum log p / n^alpha: what listing
// them all, by recursion over the prefixes, gives (scores of fixed_scores, all distinct).
typedef struct listed {
    int32_t tokens[8];
    int n;
    double score;
} listed;

static void list_all(int32_t *prefix, int len, double sum, int V, int M, int end, double alpha,
                     listed *all, int *count) {
    double z[MAX_V], m = -INFINITY, total = 0;
    fixed_scores(0, prefix, len, 1, end, V, z);
    for (int v = 0; v < V; v++) m = fmax(m, z[v]);
    for (int v = 0; v < V; v++) total += exp(z[v] - m);
    for (int v = 0; v < V; v++) {
        prefix[len] = v;
        const double next = sum + z[v] - m - log(total);
        if (v != end && len < M) {
            list_all(prefix, len + 1, next, V, M, end, alpha, all, count);
            continue;
        }
        listed *h = &all[(*count)++];
        h->n = len;  // generated tokens: the start token is prefix[0]
        memcpy(h->tokens, prefix + 1, (size_t)len * sizeof(int32_t));
        h->score = next / pow(len, alpha);
    }
}

static int by_score(const void *a, const void *b) {
    const double x = ((const listed *)a)->score, y = ((const listed *)b)->score;
    return (x < y) - (x > y);
}

static void test_beam_search_of_every_hypothesis_matches_brute_force(void) {
    const int sizes[3][2] = {{3, 3}, {2, 4}, {4, 2}};  // vocab, max_new_tokens
    const double alphas[4] = {0, 1, -0.5, 2};
    int cases = 0;
    for (int c = 0; c < 3; c++)
        for (int a = 0; a < 4; a++)
            for (int stop = AG_BEAM_STOP_HEURISTIC; stop <= AG_BEAM_STOP_NEVER; stop++) {
                const int V = sizes[c][0], M = sizes[c][1];
                listed all[64];
                int n = 0;
                int32_t prefix[16] = {1};
                list_all(prefix, 1, 0, V, M, 0, alphas[a], all, &n);
                qsort(all, (size_t)n, sizeof all[0], by_score);
                int K = 1;
                for (int t = 0; t < M; t++) K *= V;
                CHECK(n <= K && K <= MAX_ROWS);
                ag_search_config cfg = {.max_new_tokens = M, .end_token = 0, .num_beams = K,
                                        .num_return = n, .length_penalty = alphas[a],
                                        .stop = (ag_beam_stop)stop};
                fixed_model f;
                fixed_model_init(&f, V, 1, 0);
                ag_search *s = ag_search_new(1, V, 1, &cfg);
                int32_t out[64 * 8];
                int lengths[64];
                double scores[64];
                CHECK(ag_search_run(s, &(ag_search_model){fixed_step, NULL, &f},
                                    (const int32_t[]){1}, out, lengths, scores));
                for (int r = 0; r < n; r++) {
                    CHECK(lengths[r] == all[r].n);
                    CHECK(memcmp(out + r * M, all[r].tokens, (size_t)all[r].n * 4) == 0);
                    CHECK_NEAR(scores[r], all[r].score, 1e-12);
                }
                ag_search_free(s);
                fixed_model_free(&f);
                cases++;
            }
    CHECK(cases == 36);
}

// Inputs do not see each other: a batch of three gives what three searches of one give.
static void test_a_batch_gives_what_each_input_alone_gives(void) {
    for (int c = 0; c < n_cases; c++) {
        const search_ref *r = &search_refs[c];
        fixed_model f;
        results all;
        CHECK(run_case(r, false, &f, &all));
        for (int b = 0; b < r->batch; b++) {
            search_ref one = *r;
            one.batch = 1;
            memcpy(one.start[0], r->start[b], sizeof one.start[0]);
            f.source_offset = b;
            results res;
            CHECK(run_case_on(&one, &f, &res));
            const int R = r->num_return, M = r->max_new;
            CHECK(memcmp(res.out, all.out + b * R * M, (size_t)R * M * sizeof(int32_t)) == 0);
            CHECK(memcmp(res.lengths, all.lengths + b * R, (size_t)R * sizeof(int)) == 0);
            for (int i = 0; i < R; i++) CHECK(res.scores[i] == all.scores[b * R + i]);
        }
        fixed_model_free(&f);
    }
}

// A run started from the step of another on the same search refilled the hypotheses the
// running one was reading, which then finished from the inner run's (silently other
// results), and a free from there took them away. Both are refused, and the outer run
// gives what it gives alone.
typedef struct {
    fixed_model f, inner;
    ag_search *s;
    const int32_t *start;
    int steps;
    bool inner_ok;
} reentry;

static ag_tensor *reentering_step(void *model, const ag_search_hyps *h) {
    reentry *r = model;
    if (++r->steps == 2) {
        results res;
        ag_search_model m = {fixed_step, NULL, &r->inner};
        r->inner_ok = ag_search_run(r->s, &m, r->start, res.out, res.lengths, res.scores);
        ag_search_free(r->s);
    }
    return fixed_step(&r->f, h);
}

static void test_a_run_from_inside_one_is_refused(void) {
    const search_ref *ref = &search_refs[0];
    results alone, outer;
    reentry r;
    CHECK(run_case(ref, false, &r.f, &alone));
    fixed_model_free(&r.f);
    fixed_model_init(&r.f, ref->vocab, ref->start_len, ref->end);
    fixed_model_init(&r.inner, ref->vocab, ref->start_len, ref->end);
    r.inner.source_offset = 1;  // other scores than the outer run's
    ag_search_config cfg = config_of(ref);
    r.s = ag_search_new(ref->batch, ref->vocab, ref->start_len, &cfg);
    int32_t start[3 * SEARCH_REF_MAX_START];
    for (int b = 0; b < ref->batch; b++)
        for (int i = 0; i < ref->start_len; i++) start[b * ref->start_len + i] = ref->start[b][i];
    r.start = start, r.steps = 0, r.inner_ok = true;
    testing_catch_errors();
    CHECK(ag_search_run(r.s, &(ag_search_model){reentering_step, NULL, &r}, start, outer.out,
                        outer.lengths, outer.scores));
    CHECK(!r.inner_ok && testing_error_count == 2);
    CHECK(strstr(testing_last_error, "search_free: the search is running") != NULL);
    testing_release_errors();
    const size_t n = (size_t)ref->batch * ref->num_return;
    CHECK(memcmp(outer.out, alone.out, n * ref->max_new * sizeof(int32_t)) == 0);
    CHECK(memcmp(outer.lengths, alone.lengths, n * sizeof(int)) == 0);
    for (size_t i = 0; i < n; i++) CHECK(outer.scores[i] == alone.scores[i]);
    ag_search_free(r.s);
    fixed_model_free(&r.f);
    fixed_model_free(&r.inner);
}

// A model that keeps a state per hypothesis and follows every reorder sees, at every
// step, exactly the hypotheses the search holds: the reorder contract.
static void test_reorders_keep_a_models_state_with_its_hypothesis(void) {
    for (int c = 0; c < n_cases; c++) {
        const search_ref *r = &search_refs[c];
        fixed_model f;
        results res;
        CHECK(run_case(r, true, &f, &res));
        CHECK(f.state_ok);
        if (r->beams > 1) CHECK(f.reorders > 0);
        for (int i = 0; i < r->batch * r->num_return; i++) CHECK(res.lengths[i] == r->lengths[i]);
        fixed_model_free(&f);
    }
}

// Greedy ends each input at its end token (kept, then -1), the others go on; the
// inputs that ended leave the live rows, so the model is told.
static void test_greedy_stops_each_input_at_its_end_token(void) {
    const search_ref *r = NULL;
    for (size_t c = 0; c < sizeof search_refs / sizeof search_refs[0]; c++)
        if (strcmp(search_refs[c].name, "greedy_alpha1") == 0) r = &search_refs[c];
    CHECK(r != NULL);
    if (!r) return;
    fixed_model f;
    results res;
    CHECK(run_case(r, true, &f, &res));
    const int32_t *out = res.out;
    const int *lengths = res.lengths;
    bool some_shorter = false;
    for (int b = 0; b < 3; b++) {
        const int n = lengths[b];
        CHECK(n >= 1 && n <= r->max_new);
        if (n < r->max_new) {
            some_shorter = true;
            CHECK(out[b * r->max_new + n - 1] == r->end);
            for (int t = n; t < r->max_new; t++) CHECK(out[b * r->max_new + t] == -1);
        }
        for (int t = 0; t < n - 1; t++) CHECK(out[b * r->max_new + t] != r->end);
    }
    CHECK(some_shorter);
    CHECK(f.state_ok);
    fixed_model_free(&f);
}

// Everything a run needs comes from ag_search_new: from the second step on, nothing is
// allocated (the model here allocates nothing either).
static void test_a_search_step_allocates_nothing(void) {
    for (int beams = 1; beams <= 4; beams += 3) {
        fixed_model f;
        fixed_model_init(&f, 9, 1, -1);
        f.stateful = true;
        ag_search_config cfg = {.max_new_tokens = 20, .end_token = -1, .num_beams = beams,
                                .length_penalty = 1};
        ag_search *s = ag_search_new(4, 9, 1, &cfg);
        int32_t start[4] = {1, 2, 3, 4}, out[4 * 20];
        int lengths[4];
        CHECK(ag_search_run(s, &(ag_search_model){fixed_step, fixed_reorder, &f}, start, out,
                            lengths, NULL));
        CHECK(f.steps == 20);
        CHECK(f.allocs_at_step[19] == f.allocs_at_step[1]);
        ag_search_free(s);
        fixed_model_free(&f);
    }
}

// Without beams the next token is what an ag_sampler with the same configuration and
// generator draws from each live row in turn: top_k 1 is greedy, and a run is
// reproducible from its seed.
static void test_sampling_draws_as_the_sampler_does(void) {
    fixed_model f;
    fixed_model_init(&f, 7, 1, -1);
    ag_search_config greedy = {.max_new_tokens = 8, .end_token = -1};
    ag_search_config top1 = {.max_new_tokens = 8, .end_token = -1,
                             .sample = {.temperature = 1.5, .top_k = 1}, .seed = 3};
    ag_search_config hot = {.max_new_tokens = 8, .end_token = -1,
                            .sample = {.temperature = 1.5}, .seed = 3, .stream = 4};
    int32_t start[2] = {1, 2}, a[16], b[16], c[16], d[16];
    int len[2];
    ag_search_model m = {fixed_step, NULL, &f};
    ag_search *s = ag_search_new(2, 7, 1, &greedy);
    CHECK(ag_search_run(s, &m, start, a, len, NULL));
    ag_search_free(s);
    s = ag_search_new(2, 7, 1, &top1);
    CHECK(ag_search_run(s, &m, start, b, len, NULL));
    ag_search_free(s);
    CHECK(memcmp(a, b, sizeof a) == 0);
    s = ag_search_new(2, 7, 1, &hot);
    CHECK(ag_search_run(s, &m, start, c, len, NULL));
    CHECK(ag_search_run(s, &m, start, d, len, NULL));  // the generator goes on
    ag_search_free(s);
    CHECK(memcmp(a, c, sizeof a) != 0);
    // The draws by hand: one sampler, rows in order, step after step.
    ag_sampler *sm = ag_sampler_new(7, &hot.sample, hot.seed, hot.stream);
    int32_t toks[2][9] = {{1}, {2}};
    double z[2 * 7];
    ag_tensor *zt = ag_tensor_zeros(AG_F64, 2, (int[]){2, 7});
    for (int t = 0; t < 8; t++) {
        for (int i = 0; i < 2; i++) fixed_scores(i, toks[i], t + 1, 1, -1, 7, z + i * 7);
        memcpy(zt->data, z, sizeof z);
        for (int i = 0; i < 2; i++) toks[i][t + 1] = ag_sampler_next(sm, zt, (size_t)i);
    }
    for (int i = 0; i < 2; i++) CHECK(memcmp(toks[i] + 1, c + i * 8, 8 * sizeof(int32_t)) == 0);
    ag_tensor_free(zt);
    ag_sampler_free(sm);
    fixed_model_free(&f);
}

static void test_bad_configurations_and_steps_are_refused_with_one_line(void) {
    testing_catch_errors();
    ag_search_config beams_sampling = {.max_new_tokens = 4, .num_beams = 3,
                                       .sample = {.temperature = 1}};
    CHECK(!ag_search_new(2, 7, 1, &beams_sampling));
    CHECK(strstr(testing_last_error, "search: beam search does not sample") == testing_last_error);
    ag_search_config too_many = {.max_new_tokens = 4, .num_beams = 3, .num_return = 4};
    CHECK(!ag_search_new(2, 7, 1, &too_many));
    CHECK(strstr(testing_last_error, "num_return 4 must be in [1, 3]"));
    ag_search_config end_outside = {.max_new_tokens = 4, .end_token = 7};
    CHECK(!ag_search_new(2, 7, 1, &end_outside));
    ag_search_config no_tokens = {.max_new_tokens = 0};
    CHECK(!ag_search_new(2, 7, 1, &no_tokens));
    ag_search_config nan_penalty = {.max_new_tokens = 4, .length_penalty = NAN};
    CHECK(!ag_search_new(2, 7, 1, &nan_penalty));
    CHECK(testing_error_count == 5);
    testing_catch_errors();  // count afresh
    CHECK(!ag_search_new(2, 7, 1, NULL));  // was "got ... max_new_tokens 0, num_beams 0"
    CHECK(testing_error_was("search: the config is NULL"));

    fixed_model f;
    fixed_model_init(&f, 7, 1, -1);
    ag_search_config ok = {.max_new_tokens = 4, .end_token = -1, .num_beams = 2};
    ag_search *s = ag_search_new(2, 7, 1, &ok);
    int32_t out[2 * 4], bad_start[2] = {1, 7}, start[2] = {1, 2};
    int len[2];
    ag_search_model m = {fixed_step, NULL, &f};
    // The sampler's ranges hold with beams too (the settings are ignored there, but a
    // top_k of -1 was accepted with beams and refused without them).
    testing_catch_errors();
    ag_search_config beams_bad_k = {.max_new_tokens = 4, .num_beams = 3, .sample = {.top_k = -1}};
    CHECK(!ag_search_new(2, 7, 1, &beams_bad_k));
    CHECK(testing_error_was("search: needs vocab >= 1, temperature >= 0, top_k >= 0, top_p in "
                            "[0, 1]; got vocab 7, temperature 0, top_k -1, top_p 0"));
    // n^length_penalty beyond double's range (every score -0, -inf or NaN): 4^600 and 4^-600.
    for (int sign = -1; sign <= 1; sign += 2) {
        ag_search_config huge = {.max_new_tokens = 4, .num_beams = 2,
                                 .length_penalty = sign * 600.0};
        CHECK(!ag_search_new(2, 7, 1, &huge));
        CHECK(strstr(testing_last_error, "n^length_penalty is beyond double's range for n up "
                                         "to max_new_tokens 4") != NULL);
        CHECK(testing_error_count == 1);
        testing_catch_errors();
    }
    // 2 K candidates an input are counted in int: K above INT_MAX / 2 is too large (it
    // passed, as batch K fits an int, and allocated gigabytes before any step).
    ag_search_config half = {.max_new_tokens = 1, .num_beams = (1 << 30) + 1};
    CHECK(!ag_search_new(1, 7, 1, &half));
    CHECK(testing_error_was("search: batch 1 by num_beams 1073741825 hypotheses of 1 + 1 tokens "
                            "is too large"));
    ag_search_config large = {.max_new_tokens = 4, .num_beams = 2, .length_penalty = 500};
    ag_search *fine = ag_search_new(2, 7, 1, &large);  // 4^500 = 1e301: in range
    CHECK(fine != NULL);
    ag_search_free(fine);
    CHECK(!ag_search_run(s, &m, bad_start, out, len, NULL));
    CHECK(strcmp(testing_last_error, "search_run: start token 7 at 1 is outside [0, 7)") == 0);
    f.nan_at_step = 2;
    CHECK(!ag_search_run(s, &m, start, out, len, NULL));
    CHECK(strcmp(testing_last_error, "search: row 0 of the step's scores [4,7] holds a NaN") == 0);
    ag_search_free(s);
    // A step giving the wrong vocabulary.
    s = ag_search_new(2, 6, 1, &(ag_search_config){.max_new_tokens = 4, .end_token = -1});
    f.nan_at_step = 0, f.steps = 0;
    CHECK(!ag_search_run(s, &m, start, out, len, NULL));
    CHECK(strcmp(testing_last_error,
                 "search_run: the step gave f64 [2,7], expected f32 or f64 [2,6]") == 0);
    CHECK(len[0] == 0 && out[0] == -1);
    ag_search_free(s);
    CHECK(!strchr(testing_last_error, '\n'));
    testing_release_errors();
    fixed_model_free(&f);
}

static ag_tensor *scores_step(void *model, const ag_search_hyps *h) {
    (void)h;
    return model;
}

// A row holding +inf among finite scores has NaN log-probabilities (inf - inf): refused as
// such, for greedy search too, not reported as a row without a finite score.
static void test_a_row_holding_plus_inf_is_refused_as_nan_log_probabilities(void) {
    ag_tensor *z = ag_tensor_from(AG_F64, 2, (int[]){1, 3}, (double[]){0.5, INFINITY, -1});
    ag_tensor *none = ag_tensor_from(AG_F64, 2, (int[]){1, 3},
                                     (double[]){-INFINITY, -INFINITY, -INFINITY});
    ag_search *s = ag_search_new(1, 3, 1, &(ag_search_config){.max_new_tokens = 2,
                                                              .end_token = -1});
    int32_t out[2];
    testing_catch_errors();
    CHECK(!ag_search_run(s, &(ag_search_model){scores_step, NULL, z}, (int32_t[]){0}, out, NULL,
                         NULL));
    CHECK(testing_error_was("search: row 0 of the step's scores [1,3] holds +inf: its "
                            "log-probabilities are NaN"));
    CHECK(!ag_search_run(s, &(ag_search_model){scores_step, NULL, none}, (int32_t[]){0}, out,
                         NULL, NULL));
    CHECK(testing_error_was("search: row 0 of the step's scores [1,3] has no finite score"));
    testing_release_errors();
    ag_search_free(s);
    ag_tensor_free(z), ag_tensor_free(none);
}

// Scores without data (the gradient view of a tensor no backward has reached) were read
// through NULL; they are refused as scores of the wrong shape are.
static void test_scores_without_data_are_refused(void) {
    ag_tensor *z = ag_tensor_zeros(AG_F32, 2, (int[]){1, 3});
    ag_tensor view = ag_tensor_grad_view(z);
    ag_search *s = ag_search_new(1, 3, 1, &(ag_search_config){.max_new_tokens = 2,
                                                              .end_token = -1});
    int32_t out[2];
    testing_catch_errors();
    CHECK(!ag_search_run(s, &(ag_search_model){scores_step, NULL, &view}, (int32_t[]){0}, out,
                         NULL, NULL));
    CHECK(testing_error_was("search_run: the step gave scores [1,3] without data (a gradient "
                            "view no backward has reached)"));
    testing_release_errors();
    ag_search_free(s);
    ag_tensor_free(z);
}

int main(void) {
    RUN(test_beam_search_matches_the_independent_reference);
    RUN(test_greedy_search_matches_the_independent_reference);
    RUN(test_beam_search_of_every_hypothesis_matches_brute_force);
    RUN(test_a_batch_gives_what_each_input_alone_gives);
    RUN(test_reorders_keep_a_models_state_with_its_hypothesis);
    RUN(test_a_run_from_inside_one_is_refused);
    RUN(test_greedy_stops_each_input_at_its_end_token);
    RUN(test_a_search_step_allocates_nothing);
    RUN(test_sampling_draws_as_the_sampler_does);
    RUN(test_bad_configurations_and_steps_are_refused_with_one_line);
    RUN(test_a_row_holding_plus_inf_is_refused_as_nan_log_probabilities);
    RUN(test_scores_without_data_are_refused);
    return testing_summary();
}
