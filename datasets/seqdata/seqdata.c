// A dataset of sequences in memory: generating it, cutting it into batches,
// shuffling it, and comparing two datasets for shared sequences.
#include <string.h>

#include "seqdata_internal.h"

ag_seqdata *ag_seqdata_generate(ag_task task, int length, int count, uint64_t seed,
                                uint64_t stream) {
    if (!seq_task_valid(task)) {
        ag_error("seqdata_generate: unknown task %d", (int)task);
        return NULL;
    }
    if (length < 1 || length > seq_task_max_length(task)) {
        ag_error("seqdata_generate: length %d out of range for task %s: 1 to %d", length,
                 ag_task_name(task), seq_task_max_length(task));
        return NULL;
    }
    if (count < 1 || count > AG_SEQ_MAX_COUNT) {
        ag_error("seqdata_generate: count %d out of range: 1 to %d", count, AG_SEQ_MAX_COUNT);
        return NULL;
    }
    ag_seqdata *d = seq_calloc(sizeof *d);
    seq_task_layout(d, task, length);
    d->count = count;
    d->has_seed = true;
    d->seed = seed;
    d->stream = stream;
    d->tokens = seq_malloc((size_t)count * (size_t)d->seq_len * sizeof *d->tokens);
    // One generator runs through all sequences in order, so a dataset of
    // count n is a prefix of the dataset of count n + 1.
    ag_pcg32 rng = ag_pcg32_make(seed, stream);
    for (int i = 0; i < count; i++)
        seq_task_generate(d, &rng, d->tokens + (size_t)i * (size_t)d->seq_len);
    return d;
}

void ag_seqdata_free(ag_seqdata *d) {
    if (!d) return;
    free(d->tokens);
    free(d);
}

const int32_t *ag_seqdata_seq(const ag_seqdata *d, int i) {
    if (!d || i < 0 || i >= d->count) {
        ag_error("seqdata_seq: sequence %d out of range: count %d", i, d ? d->count : 0);
        return NULL;
    }
    return d->tokens + (size_t)i * (size_t)d->seq_len;
}

// The output arrays: a and b always, c for the seq2seq split.
static bool batch_in_range(const char *op, const ag_seqdata *d, int first, int B,
                           const int32_t *a, const int32_t *b, bool c_given) {
    if (!d) {
        ag_error("%s: dataset is NULL", op);
        return false;
    }
    if (B < 1 || first < 0 || first > d->count - B) {
        ag_error("%s: sequences [%d, %lld) out of range: count %d", op, first,
                 (long long)first + B, d->count);
        return false;
    }
    if (!a || !b || !c_given) {
        ag_error("%s: an output array is NULL (%d sequences requested)", op, B);
        return false;
    }
    return true;
}

// The target for token s[pos]: itself if scored, else the ignore index.
static int32_t target_at(const ag_seqdata *d, const int32_t *s, int pos) {
    return pos >= d->scored_from ? s[pos] : AG_IGNORE_INDEX;
}

// inputs, targets: [B, N-1]
void ag_seqdata_batch(const ag_seqdata *d, int first, int B, int32_t *inputs, int32_t *targets) {
    if (!batch_in_range("seqdata_batch", d, first, B, inputs, targets, true)) return;
    int N = d->seq_len;
    for (int b = 0; b < B; b++) {
        const int32_t *s = d->tokens + (size_t)(first + b) * (size_t)N;
        int32_t *in = inputs + (size_t)b * (size_t)(N - 1);
        int32_t *tg = targets + (size_t)b * (size_t)(N - 1);
        for (int t = 0; t < N - 1; t++) {
            in[t] = s[t];
            tg[t] = target_at(d, s, t + 1);
        }
    }
}

// source: [B, source_len], dec_in, dec_tgt: [B, target_len]
void ag_seqdata_batch_seq2seq(const ag_seqdata *d, int first, int B, int32_t *source,
                              int32_t *dec_in, int32_t *dec_tgt) {
    if (!batch_in_range("seqdata_batch_seq2seq", d, first, B, source, dec_in, dec_tgt != NULL))
        return;
    int S = d->source_len, T = d->target_len;
    for (int b = 0; b < B; b++) {
        const int32_t *s = d->tokens + (size_t)(first + b) * (size_t)d->seq_len;
        memcpy(source + (size_t)b * (size_t)S, s, (size_t)S * sizeof *s);
        for (int t = 0; t < T; t++) {
            dec_in[(size_t)b * (size_t)T + (size_t)t] = s[S + t];  // starts at the separator
            dec_tgt[(size_t)b * (size_t)T + (size_t)t] = target_at(d, s, S + 1 + t);
        }
    }
}

void ag_seqdata_shuffle(ag_seqdata *d, ag_pcg32 *rng) {
    if (!d || !rng) {
        ag_error("seqdata_shuffle: %s is NULL", d ? "rng" : "dataset");
        return;
    }
    size_t N = (size_t)d->seq_len;
    int32_t *tmp = seq_malloc(N * sizeof *tmp);
    for (int i = d->count - 1; i > 0; i--) {
        int j = (int)ag_pcg32_bounded(rng, (uint32_t)i + 1);
        if (j == i) continue;
        int32_t *a = d->tokens + (size_t)i * N, *b = d->tokens + (size_t)j * N;
        memcpy(tmp, a, N * sizeof *tmp);
        memcpy(a, b, N * sizeof *tmp);
        memcpy(b, tmp, N * sizeof *tmp);
    }
    free(tmp);
    d->has_seed = false;  // the rows are no longer generate(seed, stream) in order
    d->seed = d->stream = 0;
}

// ---- Shared sequences -----------------------------------------------------------------
// An open-addressing hash set of a's rows (FNV-1a over the token bytes), then
// one lookup per row of b: linear in the sizes, no sorting.
static uint64_t row_hash(const int32_t *s, int n) {
    uint64_t h = 14695981039346656037ULL;
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)s[i];
        for (int k = 0; k < 4; k++) {
            h ^= (v >> (8 * k)) & 0xffu;
            h *= 1099511628211ULL;
        }
    }
    return h;
}

int ag_seqdata_count_shared(const ag_seqdata *a, const ag_seqdata *b) {
    if (!a || !b) {
        ag_error("seqdata_count_shared: dataset is NULL");
        return 0;
    }
    if (a->seq_len != b->seq_len) return 0;
    int N = a->seq_len;
    size_t cap = 2;
    while (cap < 2 * (size_t)a->count) cap *= 2;
    int *slots = seq_malloc(cap * sizeof *slots);  // row index of a, or -1
    for (size_t k = 0; k < cap; k++) slots[k] = -1;
    for (int i = 0; i < a->count; i++) {
        const int32_t *s = a->tokens + (size_t)i * (size_t)N;
        size_t k = (size_t)row_hash(s, N) & (cap - 1);
        while (slots[k] >= 0) k = (k + 1) & (cap - 1);
        slots[k] = i;
    }
    int shared = 0;
    for (int i = 0; i < b->count; i++) {
        const int32_t *s = b->tokens + (size_t)i * (size_t)N;
        for (size_t k = (size_t)row_hash(s, N) & (cap - 1); slots[k] >= 0;
             k = (k + 1) & (cap - 1)) {
            const int32_t *r = a->tokens + (size_t)slots[k] * (size_t)N;
            if (memcmp(r, s, (size_t)N * sizeof *s) == 0) {
                shared++;
                break;
            }
        }
    }
    free(slots);
    return shared;
}

// ---- Tokens and characters ------------------------------------------------------------
char ag_seqdata_char(const ag_seqdata *d, int32_t id) {
    if (id == AG_IGNORE_INDEX) return '_';
    if (!d || id < 0 || id >= d->vocab) return '?';
    return d->alphabet[id];
}

int32_t ag_seqdata_token(const ag_seqdata *d, char c) {
    if (!d || c == 0) return -1;
    const char *p = strchr(d->alphabet, c);
    return p ? (int32_t)(p - d->alphabet) : -1;
}
