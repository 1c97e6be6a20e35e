// The three sequence tasks: alphabets, layouts, the generator of one sequence
// and the checker of one sequence. Everything else in datasets/seqdata is
// task-agnostic and goes through these functions.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "seqdata_internal.h"

// Digits first and the separator at 10 in both alphabets, so a digit's token
// id is its value in every task.
static const char copy_alphabet[] = "0123456789|";
static const char recall_alphabet[] = "0123456789|abcdefghijklmnop";
enum { N_SYMBOLS = 10, N_KEYS = 16 };

bool seq_task_valid(ag_task t) {
    return t == AG_TASK_COPY || t == AG_TASK_REVERSE || t == AG_TASK_RECALL;
}

const char *ag_task_name(ag_task t) {
    switch (t) {
    case AG_TASK_COPY: return "copy";
    case AG_TASK_REVERSE: return "reverse";
    case AG_TASK_RECALL: return "recall";
    }
    return "?";
}

int ag_task_from_name(const char *name, ag_task *out) {
    static const ag_task all[] = {AG_TASK_COPY, AG_TASK_REVERSE, AG_TASK_RECALL};
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(name, ag_task_name(all[i])) == 0) {
            if (out) *out = all[i];
            return 0;
        }
    }
    return -1;
}

const char *seq_task_alphabet(ag_task t) {
    return t == AG_TASK_RECALL ? recall_alphabet : copy_alphabet;
}

int seq_task_max_length(ag_task t) {
    return t == AG_TASK_RECALL ? AG_SEQ_MAX_PAIRS : AG_SEQ_MAX_LENGTH;
}

void seq_task_layout(ag_seqdata *d, ag_task t, int length) {
    d->task = t;
    d->length = length;
    d->alphabet = seq_task_alphabet(t);
    d->vocab = (int)strlen(d->alphabet);
    d->sep_token = SEQ_SEP_TOKEN;
    if (t == AG_TASK_RECALL) {
        d->source_len = 2 * length;       // k1 v1 .. kn vn
        d->seq_len = d->source_len + 3;   // | kq vq
        d->scored_from = d->seq_len - 1;  // only vq
    } else {
        d->source_len = length;              // x1 .. xL
        d->seq_len = 2 * length + 1;         // | and L more
        d->scored_from = d->source_len + 1;  // the whole second half
    }
    d->target_len = d->seq_len - d->source_len - 1;
}

// ---- Generation ---------------------------------------------------------------------
// The order of draws is part of the committed datasets: changing it changes
// every file under datasets/.
void seq_task_generate(const ag_seqdata *d, ag_pcg32 *rng, int32_t *s) {
    int n = d->length;
    if (d->task != AG_TASK_RECALL) {
        for (int i = 0; i < n; i++) s[i] = (int32_t)ag_pcg32_bounded(rng, N_SYMBOLS);
        s[n] = SEQ_SEP_TOKEN;
        for (int i = 0; i < n; i++) s[n + 1 + i] = d->task == AG_TASK_COPY ? s[i] : s[n - 1 - i];
        return;
    }
    // Distinct keys by a partial Fisher-Yates shuffle of the 16 keys; each
    // pair draws its key, then its value; then the query picks a pair.
    int keys[N_KEYS];
    for (int i = 0; i < N_KEYS; i++) keys[i] = i;
    for (int i = 0; i < n; i++) {
        int j = i + (int)ag_pcg32_bounded(rng, (uint32_t)(N_KEYS - i));
        int k = keys[j];
        keys[j] = keys[i];
        keys[i] = k;
        s[2 * i] = SEQ_FIRST_KEY_TOKEN + k;
        s[2 * i + 1] = (int32_t)ag_pcg32_bounded(rng, N_SYMBOLS);
    }
    int q = (int)ag_pcg32_bounded(rng, (uint32_t)n);
    s[2 * n] = SEQ_SEP_TOKEN;
    s[2 * n + 1] = s[2 * q];
    s[2 * n + 2] = s[2 * q + 1];
}

// ---- Checking -------------------------------------------------------------------------
const char *seq_describe_char(int c, char buf[16]) {
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 16, "'%c'", c);
    else
        snprintf(buf, 16, "byte 0x%02x", (unsigned)(c & 0xff));
    return buf;
}

// What may stand at a position.
typedef enum { SYMBOL, KEY, SEPARATOR } slot;

static slot slot_at(const ag_seqdata *d, int pos) {
    if (pos == d->source_len) return SEPARATOR;
    if (d->task != AG_TASK_RECALL) return SYMBOL;
    if (pos < d->source_len) return pos % 2 == 0 ? KEY : SYMBOL;
    return pos == d->source_len + 1 ? KEY : SYMBOL;
}

static bool fits(slot want, int32_t id) {
    switch (want) {
    case SYMBOL: return id >= 0 && id < N_SYMBOLS;
    case KEY: return id >= SEQ_FIRST_KEY_TOKEN && id < SEQ_FIRST_KEY_TOKEN + N_KEYS;
    case SEPARATOR: return id == SEQ_SEP_TOKEN;
    }
    return false;
}

static const char *slot_name(const ag_seqdata *d, slot want) {
    switch (want) {
    case SYMBOL: return d->task == AG_TASK_RECALL ? "a value (0-9)" : "a symbol (0-9)";
    case KEY: return "a key (a-p)";
    case SEPARATOR: return "the separator '|'";
    }
    return "?";
}

// Writes "column <pos+1>: <what>" into problem; returns 1 (a problem found).
static int problem_at(char *problem, size_t size, int pos, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static int problem_at(char *problem, size_t size, int pos, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(problem, size, "column %d: %s", pos + 1, what);
    return 1;
}

// The quoted character of a token id known to be in the vocabulary.
static const char *describe(const ag_seqdata *d, int32_t id, char buf[16]) {
    return seq_describe_char((unsigned char)d->alphabet[id], buf);
}

int seq_task_check(const ag_seqdata *d, const int32_t *s, char *problem, size_t size) {
    char got[16], want[16], key[16];
    for (int pos = 0; pos < d->seq_len; pos++) {
        if (s[pos] < 0 || s[pos] >= d->vocab)
            return problem_at(problem, size, pos, "token id %ld is outside the vocabulary (0-%d)",
                              (long)s[pos], d->vocab - 1);
        slot need = slot_at(d, pos);
        if (!fits(need, s[pos]))
            return problem_at(problem, size, pos, "expected %s, found %s", slot_name(d, need),
                              describe(d, s[pos], got));
    }
    int L = d->length;
    if (d->task != AG_TASK_RECALL) {
        bool copy = d->task == AG_TASK_COPY;
        for (int i = 0; i < L; i++) {
            int pos = L + 1 + i;
            int32_t expect = copy ? s[i] : s[L - 1 - i];
            if (s[pos] == expect) continue;
            if (copy)
                return problem_at(problem, size, pos,
                                  "second half differs from the first: %s where the copy has %s",
                                  describe(d, s[pos], got), describe(d, expect, want));
            return problem_at(problem, size, pos,
                              "second half is not the first reversed: %s where the reversal has %s",
                              describe(d, s[pos], got), describe(d, expect, want));
        }
        return 0;
    }
    // recall: keys distinct, the query among them, the answer its value.
    for (int i = 0; i < L; i++)
        for (int j = 0; j < i; j++)
            if (s[2 * i] == s[2 * j])
                return problem_at(problem, size, 2 * i, "key %s repeats the key at column %d",
                                  describe(d, s[2 * i], got), 2 * j + 1);
    int q = d->source_len + 1;
    for (int i = 0; i < L; i++) {
        if (s[2 * i] != s[q]) continue;
        if (s[q + 1] == s[2 * i + 1]) return 0;
        return problem_at(problem, size, q + 1,
                          "answer %s differs from %s, the value stored with key %s at column %d",
                          describe(d, s[q + 1], got), describe(d, s[2 * i + 1], want),
                          describe(d, s[q], key), 2 * i + 1);
    }
    return problem_at(problem, size, q, "query key %s is not among the keys",
                      describe(d, s[q], got));
}

// ---- Description ---------------------------------------------------------------------------
void seq_task_describe(const ag_seqdata *d, char *buf, size_t size) {
    int L = d->length;
    switch (d->task) {
    case AG_TASK_COPY:
        snprintf(buf, size,
                 "copy: %d symbols (0-9), the separator '|', then the same %d symbols again.\n"
                 "A model is scored on the %d symbols after the separator.",
                 L, L, L);
        return;
    case AG_TASK_REVERSE:
        snprintf(buf, size,
                 "reverse: %d symbols (0-9), the separator '|', then the %d symbols in reverse.\n"
                 "A model is scored on the %d symbols after the separator.",
                 L, L, L);
        return;
    case AG_TASK_RECALL:
        snprintf(buf, size,
                 "recall: %d pairs of a key (a-p, all different) and its value (0-9),\n"
                 "the separator '|', then one of the keys again and its value.\n"
                 "A model is scored only on that last value.",
                 L);
        return;
    }
    snprintf(buf, size, "?");
}
