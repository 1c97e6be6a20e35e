// Sequence tasks in memory: generation is deterministic and keeps each task's
// invariants, batches put inputs, targets and ignored positions where the
// documentation says, and the helpers (shuffle, shared count, characters)
// do what they promise. Small datasets are written by hand as files and
// loaded, so the expected tokens are visible in the test.
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <unistd.h>

#include "seqdata.h"
#include "testing.h"

// ---- Helpers -------------------------------------------------------------------------
static char tmp_dir[64];

static ag_seqdata *load_text(const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/hand.txt", tmp_dir);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
    ag_err err;
    ag_seqdata *d = ag_seqdata_load(path, &err);
    if (!d) fprintf(stderr, "  load failed: %s\n", err.msg);
    remove(path);
    return d;
}

static bool same_tokens(const ag_seqdata *a, const ag_seqdata *b) {
    return a->count == b->count && a->seq_len == b->seq_len &&
           memcmp(a->tokens, b->tokens, (size_t)a->count * (size_t)a->seq_len * 4) == 0;
}

// The invariants, written out independently of the library's checker.
static bool copy_ok(const ag_seqdata *d, const int32_t *s, bool reversed) {
    int L = d->length;
    if (s[L] != 10) return false;
    for (int i = 0; i < L; i++) {
        if (s[i] < 0 || s[i] > 9) return false;
        if (s[L + 1 + i] != (reversed ? s[L - 1 - i] : s[i])) return false;
    }
    return true;
}

static bool recall_ok(const ag_seqdata *d, const int32_t *s) {
    int n = d->length, found = 0;
    for (int i = 0; i < n; i++) {
        if (s[2 * i] < 11 || s[2 * i] > 26 || s[2 * i + 1] < 0 || s[2 * i + 1] > 9) return false;
        for (int j = 0; j < i; j++)
            if (s[2 * j] == s[2 * i]) return false;
        if (s[2 * i] == s[2 * n + 1]) found += s[2 * i + 1] == s[2 * n + 2] ? 1 : 100;
    }
    return s[2 * n] == 10 && found == 1;
}

static bool sequence_ok(const ag_seqdata *d, const int32_t *s) {
    return d->task == AG_TASK_RECALL ? recall_ok(d, s) : copy_ok(d, s, d->task == AG_TASK_REVERSE);
}

// ---- Tasks ------------------------------------------------------------------------------
static void test_task_names_round_trip(void) {
    ag_task t = AG_TASK_COPY;
    CHECK(strcmp(ag_task_name(AG_TASK_COPY), "copy") == 0);
    CHECK(strcmp(ag_task_name(AG_TASK_REVERSE), "reverse") == 0);
    CHECK(strcmp(ag_task_name(AG_TASK_RECALL), "recall") == 0);
    CHECK(strcmp(ag_task_name((ag_task)7), "?") == 0);
    CHECK(ag_task_from_name("reverse", &t) == 0 && t == AG_TASK_REVERSE);
    CHECK(ag_task_from_name("recall", &t) == 0 && t == AG_TASK_RECALL);
    CHECK(ag_task_from_name("Copy", &t) != 0 && t == AG_TASK_RECALL);  // untouched on failure
    CHECK(ag_task_from_name("", &t) != 0);
    CHECK(ag_task_from_name(NULL, &t) != 0);
}

static void test_layout_fields_of_copy_and_recall(void) {
    ag_seqdata *c = ag_seqdata_generate(AG_TASK_COPY, 16, 4, 1, 1);
    CHECK(c->seq_len == 33 && c->source_len == 16 && c->target_len == 16);
    CHECK(c->scored_from == 17 && c->sep_token == 10 && c->vocab == 11);
    CHECK(strcmp(c->alphabet, "0123456789|") == 0);
    CHECK(c->has_seed && c->seed == 1 && c->stream == 1 && c->count == 4 && c->length == 16);
    ag_seqdata *r = ag_seqdata_generate(AG_TASK_RECALL, 8, 4, 1, 1);
    CHECK(r->seq_len == 19 && r->source_len == 16 && r->target_len == 2);
    CHECK(r->scored_from == 18 && r->sep_token == 10 && r->vocab == 27);
    CHECK(strcmp(r->alphabet, "0123456789|abcdefghijklmnop") == 0);
    ag_seqdata_free(c);
    ag_seqdata_free(r);
}

static void test_generation_is_deterministic(void) {
    for (int t = 0; t < 3; t++) {
        int length = t == AG_TASK_RECALL ? 8 : 16;
        ag_seqdata *a = ag_seqdata_generate((ag_task)t, length, 300, 42, 7);
        ag_seqdata *b = ag_seqdata_generate((ag_task)t, length, 300, 42, 7);
        CHECK(same_tokens(a, b));
        ag_seqdata_free(a);
        ag_seqdata_free(b);
    }
}

// The first tokens of copy (seed 1, stream 1) pinned, so a change to the
// generator (which would change every committed file) fails here by name.
static void test_generation_matches_pinned_tokens(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 16, 2, 1, 1);
    const int32_t want[16] = {9, 4, 5, 7, 8, 7, 6, 9, 4, 3, 9, 7, 9, 5, 6, 0};
    CHECK(memcmp(d->tokens, want, sizeof want) == 0);
    ag_seqdata_free(d);
}

static void test_different_streams_and_seeds_differ(void) {
    for (int t = 0; t < 3; t++) {
        int length = t == AG_TASK_RECALL ? 8 : 16;
        ag_seqdata *a = ag_seqdata_generate((ag_task)t, length, 200, 42, 1);
        ag_seqdata *b = ag_seqdata_generate((ag_task)t, length, 200, 42, 2);
        ag_seqdata *c = ag_seqdata_generate((ag_task)t, length, 200, 43, 1);
        CHECK(ag_seqdata_count_shared(a, b) == 0);
        CHECK(ag_seqdata_count_shared(a, c) == 0);
        ag_seqdata_free(a);
        ag_seqdata_free(b);
        ag_seqdata_free(c);
    }
}

static void test_a_smaller_count_is_a_prefix(void) {
    ag_seqdata *a = ag_seqdata_generate(AG_TASK_RECALL, 5, 10, 3, 4);
    ag_seqdata *b = ag_seqdata_generate(AG_TASK_RECALL, 5, 25, 3, 4);
    CHECK(memcmp(a->tokens, b->tokens, (size_t)10 * (size_t)a->seq_len * 4) == 0);
    ag_seqdata_free(a);
    ag_seqdata_free(b);
}

static void test_every_generated_sequence_keeps_its_task_invariants(void) {
    const int lengths[] = {1, 2, 5, 16, 16};
    for (int t = 0; t < 3; t++) {
        for (int k = 0; k < 5; k++) {
            ag_seqdata *d = ag_seqdata_generate((ag_task)t, lengths[k], 500, 9, (uint64_t)k);
            int bad = 0;
            for (int i = 0; i < d->count; i++) bad += !sequence_ok(d, ag_seqdata_seq(d, i));
            CHECK(bad == 0);
            ag_seqdata_free(d);
        }
    }
}

// Symbols, keys, values and queries should all be used, roughly uniformly.
static void test_generated_symbols_cover_the_alphabet(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_RECALL, 8, 2000, 5, 5);
    int seen[27] = {0}, query_pair[8] = {0};
    for (int i = 0; i < d->count; i++) {
        const int32_t *s = ag_seqdata_seq(d, i);
        for (int t = 0; t < 16; t++) seen[s[t]]++;
        for (int p = 0; p < 8; p++) query_pair[p] += s[2 * p] == s[17];
    }
    for (int v = 0; v < 10; v++) CHECK_NEAR(seen[v], 2000 * 8 / 10.0, 0.1);
    for (int k = 11; k < 27; k++) CHECK_NEAR(seen[k], 2000 * 8 / 16.0, 0.1);
    CHECK(seen[10] == 0);
    for (int p = 0; p < 8; p++) CHECK_NEAR(query_pair[p], 2000 / 8.0, 0.25);
    ag_seqdata_free(d);
}

static void test_generate_rejects_bad_arguments(void) {
    testing_catch_errors();
    CHECK(ag_seqdata_generate(AG_TASK_RECALL, 17, 10, 1, 1) == NULL);
    CHECK(strstr(testing_last_error, "seqdata_generate: length 17 out of range for task recall"));
    CHECK(ag_seqdata_generate(AG_TASK_COPY, 0, 10, 1, 1) == NULL);
    CHECK(strstr(testing_last_error, "length 0 out of range for task copy: 1 to 1024"));
    CHECK(ag_seqdata_generate(AG_TASK_COPY, 4, 0, 1, 1) == NULL);
    CHECK(strstr(testing_last_error, "seqdata_generate: count 0 out of range"));
    CHECK(ag_seqdata_generate((ag_task)9, 4, 1, 1, 1) == NULL);
    CHECK(strstr(testing_last_error, "seqdata_generate: unknown task 9"));
    CHECK(testing_error_count == 4);
    testing_release_errors();
}

// ---- Batches --------------------------------------------------------------------------
#define IGN AG_IGNORE_INDEX

static void test_copy_batch_scores_only_the_second_half(void) {
    ag_seqdata *d = load_text(
        "# attograd sequence dataset v1\ntask copy\nalphabet 0123456789|\n"
        "separator |\nlength 3\ncount 2\ndata\n123|123\n907|907\n");
    CHECK(d != NULL);
    if (!d) return;
    int32_t in[2 * 6], tg[2 * 6];
    ag_seqdata_batch(d, 0, 2, in, tg);
    const int32_t want_in[12] = {1, 2, 3, 10, 1, 2, 9, 0, 7, 10, 9, 0};
    const int32_t want_tg[12] = {IGN, IGN, IGN, 1, 2, 3, IGN, IGN, IGN, 9, 0, 7};
    CHECK(memcmp(in, want_in, sizeof in) == 0);
    CHECK(memcmp(tg, want_tg, sizeof tg) == 0);
    ag_seqdata_batch(d, 1, 1, in, tg);  // a batch starting inside the dataset
    CHECK(memcmp(in, want_in + 6, 6 * sizeof *in) == 0);
    CHECK(memcmp(tg, want_tg + 6, 6 * sizeof *tg) == 0);
    ag_seqdata_free(d);
}

static void test_reverse_batch_targets_the_reversal(void) {
    ag_seqdata *d = load_text(
        "# attograd sequence dataset v1\ntask reverse\nalphabet 0123456789|\n"
        "separator |\nlength 3\ncount 1\ndata\n128|821\n");
    CHECK(d != NULL);
    if (!d) return;
    int32_t in[6], tg[6];
    ag_seqdata_batch(d, 0, 1, in, tg);
    const int32_t want_in[6] = {1, 2, 8, 10, 8, 2};
    const int32_t want_tg[6] = {IGN, IGN, IGN, 8, 2, 1};
    CHECK(memcmp(in, want_in, sizeof in) == 0);
    CHECK(memcmp(tg, want_tg, sizeof tg) == 0);
    ag_seqdata_free(d);
}

static void test_recall_batch_scores_only_the_answer(void) {
    ag_seqdata *d = load_text(
        "# attograd sequence dataset v1\ntask recall\n"
        "alphabet 0123456789|abcdefghijklmnop\nseparator |\nlength 3\n"
        "count 1\ndata\nc5a1p7|a1\n");
    CHECK(d != NULL);
    if (!d) return;
    int32_t in[8], tg[8];
    ag_seqdata_batch(d, 0, 1, in, tg);
    const int32_t c = 13, a = 11, p = 26;
    const int32_t want_in[8] = {c, 5, a, 1, p, 7, 10, a};
    const int32_t want_tg[8] = {IGN, IGN, IGN, IGN, IGN, IGN, IGN, 1};
    CHECK(memcmp(in, want_in, sizeof in) == 0);
    CHECK(memcmp(tg, want_tg, sizeof tg) == 0);
    ag_seqdata_free(d);
}

// copy L = 16: 32 positions, the last 16 scored, for every sequence.
static void test_copy_batch_has_sixteen_scored_targets_per_sequence(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 16, 8, 1, 2);
    int32_t in[8 * 32], tg[8 * 32];
    ag_seqdata_batch(d, 0, 8, in, tg);
    for (int b = 0; b < 8; b++) {
        const int32_t *s = ag_seqdata_seq(d, b);
        int scored = 0;
        for (int t = 0; t < 32; t++) {
            CHECK(in[b * 32 + t] == s[t]);
            if (tg[b * 32 + t] != IGN) {
                scored++;
                CHECK(t >= 16 && tg[b * 32 + t] == s[t + 1] && tg[b * 32 + t] == s[t - 16]);
            }
        }
        CHECK(scored == 16);
    }
    ag_seqdata_free(d);
}

static void test_seq2seq_batch_splits_source_and_target(void) {
    ag_seqdata *d = load_text(
        "# attograd sequence dataset v1\ntask copy\nalphabet 0123456789|\n"
        "separator |\nlength 3\ncount 2\ndata\n123|123\n907|907\n");
    CHECK(d != NULL);
    if (!d) return;
    int32_t src[6], dec_in[6], dec_tgt[6];
    ag_seqdata_batch_seq2seq(d, 0, 2, src, dec_in, dec_tgt);
    const int32_t want_src[6] = {1, 2, 3, 9, 0, 7};
    const int32_t want_in[6] = {10, 1, 2, 10, 9, 0};
    const int32_t want_tgt[6] = {1, 2, 3, 9, 0, 7};
    CHECK(memcmp(src, want_src, sizeof src) == 0);
    CHECK(memcmp(dec_in, want_in, sizeof dec_in) == 0);
    CHECK(memcmp(dec_tgt, want_tgt, sizeof dec_tgt) == 0);
    ag_seqdata_free(d);

    d = load_text(
        "# attograd sequence dataset v1\ntask recall\n"
        "alphabet 0123456789|abcdefghijklmnop\nseparator |\nlength 2\n"
        "count 1\ndata\nb3d8|d8\n");
    CHECK(d != NULL);
    if (!d) return;
    int32_t rsrc[4], rin[2], rtgt[2];
    ag_seqdata_batch_seq2seq(d, 0, 1, rsrc, rin, rtgt);
    const int32_t want_rsrc[4] = {12, 3, 14, 8}, want_rin[2] = {10, 14}, want_rtgt[2] = {IGN, 8};
    CHECK(memcmp(rsrc, want_rsrc, sizeof rsrc) == 0);
    CHECK(memcmp(rin, want_rin, sizeof rin) == 0);
    CHECK(memcmp(rtgt, want_rtgt, sizeof rtgt) == 0);
    ag_seqdata_free(d);
}

static void test_batch_out_of_range_is_an_error(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 4, 10, 1, 1);
    int32_t in[16 * 8], tg[16 * 8];
    testing_catch_errors();
    ag_seqdata_batch(d, 8, 3, in, tg);
    CHECK(strstr(testing_last_error, "seqdata_batch: sequences [8, 11) out of range: count 10"));
    ag_seqdata_batch(d, -1, 2, in, tg);
    ag_seqdata_batch(d, 0, 0, in, tg);
    ag_seqdata_batch_seq2seq(d, 9, 2, in, tg, tg);
    CHECK(strstr(testing_last_error, "seqdata_batch_seq2seq: sequences [9, 11) out of range"));
    CHECK(ag_seqdata_seq(d, 10) == NULL);
    CHECK(testing_error_count == 5);
    testing_release_errors();
    ag_seqdata_batch(d, 7, 3, in, tg);  // the last full batch is fine
    CHECK(in[0] == ag_seqdata_seq(d, 7)[0]);
    ag_seqdata_free(d);
}

// A NULL output array is reported before anything is written; a range whose
// end passes INT_MAX is named without overflowing.
static void test_batch_into_a_null_array_is_an_error(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 4, 10, 1, 1);
    int32_t a[16], b[16];
    testing_catch_errors();
    ag_seqdata_batch(d, 0, 1, NULL, b);
    CHECK(testing_error_was("seqdata_batch: an output array is NULL (1 sequences requested)"));
    ag_seqdata_batch(d, 0, 2, a, NULL);
    CHECK(testing_error_was("seqdata_batch: an output array is NULL (2 sequences requested)"));
    ag_seqdata_batch_seq2seq(d, 0, 1, a, b, NULL);
    CHECK(testing_error_was("seqdata_batch_seq2seq: an output array is NULL (1 sequences "
                            "requested)"));
    ag_seqdata_batch(d, 2000000000, 2000000000, a, b);
    CHECK(testing_error_was("seqdata_batch: sequences [2000000000, 4000000000) out of range: "
                            "count 10"));
    testing_release_errors();
    ag_seqdata_free(d);
}

// ---- Shuffle, shared sequences, characters ------------------------------------------------
static int compare_rows(const void *a, const void *b) { return memcmp(a, b, 9 * sizeof(int32_t)); }

static void test_shuffle_permutes_sequences_deterministically(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 4, 200, 1, 1);
    ag_seqdata *e = ag_seqdata_generate(AG_TASK_COPY, 4, 200, 1, 1);
    ag_seqdata *orig = ag_seqdata_generate(AG_TASK_COPY, 4, 200, 1, 1);
    ag_pcg32 r1 = ag_pcg32_make(5, 5), r2 = ag_pcg32_make(5, 5);
    ag_seqdata_shuffle(d, &r1);
    ag_seqdata_shuffle(e, &r2);
    CHECK(same_tokens(d, e));      // same generator, same order
    CHECK(!same_tokens(d, orig));  // but a new one
    CHECK(!d->has_seed && orig->has_seed);
    int moved = 0;
    for (int i = 0; i < 200; i++)
        moved += memcmp(ag_seqdata_seq(d, i), ag_seqdata_seq(orig, i), 9 * 4) != 0;
    CHECK(moved > 150);
    // The same rows as a multiset: sort both and compare.
    qsort(d->tokens, 200, 9 * sizeof(int32_t), compare_rows);
    qsort(orig->tokens, 200, 9 * sizeof(int32_t), compare_rows);
    CHECK(same_tokens(d, orig));
    ag_seqdata_free(d);
    ag_seqdata_free(e);
    ag_seqdata_free(orig);
}

static void test_count_shared_finds_exactly_the_common_rows(void) {
    ag_seqdata *a = ag_seqdata_generate(AG_TASK_REVERSE, 6, 300, 1, 1);
    ag_seqdata *b = ag_seqdata_generate(AG_TASK_REVERSE, 6, 100, 1, 2);
    CHECK(ag_seqdata_count_shared(a, b) == 0);
    // Plant rows 10, 20 and 299 of a into b.
    const int planted[3] = {10, 20, 299};
    for (int k = 0; k < 3; k++)
        memcpy(b->tokens + (size_t)(k * 30) * 13, ag_seqdata_seq(a, planted[k]), 13 * 4);
    CHECK(ag_seqdata_count_shared(a, b) == 3);
    CHECK(ag_seqdata_count_shared(b, a) == 3);
    CHECK(ag_seqdata_count_shared(a, a) == 300);
    ag_seqdata *c = ag_seqdata_generate(AG_TASK_REVERSE, 5, 10, 1, 1);
    CHECK(ag_seqdata_count_shared(a, c) == 0);  // different lengths share nothing
    ag_seqdata_free(a);
    ag_seqdata_free(b);
    ag_seqdata_free(c);
}

static void test_characters_and_tokens_map_both_ways(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_RECALL, 2, 1, 1, 1);
    for (int32_t id = 0; id < d->vocab; id++)
        CHECK(ag_seqdata_token(d, ag_seqdata_char(d, id)) == id);
    CHECK(ag_seqdata_char(d, 0) == '0' && ag_seqdata_char(d, 10) == '|');
    CHECK(ag_seqdata_char(d, 11) == 'a' && ag_seqdata_char(d, 26) == 'p');
    CHECK(ag_seqdata_char(d, 27) == '?' && ag_seqdata_char(d, -1) == '?');
    CHECK(ag_seqdata_char(d, AG_IGNORE_INDEX) == '_');
    CHECK(ag_seqdata_token(d, 'q') == -1 && ag_seqdata_token(d, '\0') == -1);
    ag_seqdata_free(d);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "test_data_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_task_names_round_trip);
    RUN(test_layout_fields_of_copy_and_recall);
    RUN(test_generation_is_deterministic);
    RUN(test_generation_matches_pinned_tokens);
    RUN(test_different_streams_and_seeds_differ);
    RUN(test_a_smaller_count_is_a_prefix);
    RUN(test_every_generated_sequence_keeps_its_task_invariants);
    RUN(test_generated_symbols_cover_the_alphabet);
    RUN(test_generate_rejects_bad_arguments);
    RUN(test_copy_batch_scores_only_the_second_half);
    RUN(test_reverse_batch_targets_the_reversal);
    RUN(test_recall_batch_scores_only_the_answer);
    RUN(test_copy_batch_has_sixteen_scored_targets_per_sequence);
    RUN(test_seq2seq_batch_splits_source_and_target);
    RUN(test_batch_out_of_range_is_an_error);
    RUN(test_batch_into_a_null_array_is_an_error);
    RUN(test_shuffle_permutes_sequences_deterministically);
    RUN(test_count_shared_finds_exactly_the_common_rows);
    RUN(test_characters_and_tokens_map_both_ways);
    rmdir(tmp_dir);
    return testing_summary();
}
