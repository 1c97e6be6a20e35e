#define _POSIX_C_SOURCE 200809L  // lstat
#include "text.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fnv1a.h"

// Appends the file at path to t->bytes.
static bool append_file(text_data *t, const char *path, ag_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err->msg, sizeof err->msg, "%s: %s", path, strerror(errno));
        return false;
    }
    uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        uint8_t *grown = realloc(t->bytes, t->len + n);
        if (!grown) {
            fclose(f);
            snprintf(err->msg, sizeof err->msg, "%s: out of memory", path);
            return false;
        }
        t->bytes = grown;
        memcpy(t->bytes + t->len, buf, n);
        t->len += n;
    }
    bool ok = !ferror(f);
    fclose(f);
    if (!ok) snprintf(err->msg, sizeof err->msg, "%s: read error", path);
    return ok;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool append_directory(text_data *t, const char *path, ag_err *err) {
    DIR *d = opendir(path);
    if (!d) {
        snprintf(err->msg, sizeof err->msg, "%s: %s", path, strerror(errno));
        return false;
    }
    char **names = NULL;
    size_t n = 0;
    bool ok = true;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        const size_t len = strlen(path) + strlen(e->d_name) + 2;
        char *full = malloc(len);
        char **grown = full ? realloc(names, (n + 1) * sizeof *names) : NULL;
        if (!grown) {
            snprintf(err->msg, sizeof err->msg, "%s: out of memory listing its files", path);
            free(full);
            ok = false;
            break;
        }
        names = grown;
        snprintf(full, len, "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(full, &st) == 0 && S_ISREG(st.st_mode))
            names[n++] = full;
        else
            free(full);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, by_name);  // names is NULL for an empty directory
    for (size_t i = 0; i < n; i++) {
        ok = ok && append_file(t, names[i], err);
        free(names[i]);
    }
    free(names);
    return ok;
}

bool text_load(text_data *t, const char *path, double valid_fraction, size_t min_split,
               ag_err *err) {
    *t = (text_data){0};
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err->msg, sizeof err->msg, "%s: %s", path, strerror(errno));
        return false;
    }
    // A FIFO would wait for a writer and a device (/dev/zero) never end: a directory's
    // regular files are read, and a path given must be one of the two.
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        snprintf(err->msg, sizeof err->msg, "%s: is neither a regular file nor a directory",
                 path);
        return false;
    }
    if (!(S_ISDIR(st.st_mode) ? append_directory(t, path, err) : append_file(t, path, err))) {
        text_free(t);
        return false;
    }
    size_t valid = (size_t)((double)t->len * valid_fraction);
    t->train_len = t->len - valid;
    if (t->len == 0 || valid < min_split || t->train_len < min_split) {
        snprintf(err->msg, sizeof err->msg,
                 "%s: %zu bytes is too little text: each of training and validation needs "
                 "at least %zu",
                 path, t->len, min_split);
        text_free(t);
        return false;
    }
    return true;
}

void text_free(text_data *t) {
    free(t->bytes);
    *t = (text_data){0};
}

size_t text_window_start(size_t span, ag_pcg32 *rng) {
    // Spans up to 2^32 take one bounded draw, as every run before texts this long did, so
    // their windows are the same; a longer span takes 64 bits, rejecting the lowest
    // 2^64 mod span of them so that the modulo is unbiased.
    if (span <= (size_t)UINT32_MAX + 1) return ag_pcg32_bounded(rng, (uint32_t)span);
    const uint64_t n = span, threshold = -n % n;
    for (;;) {
        const uint64_t hi = ag_pcg32_next(rng), r = hi << 32 | ag_pcg32_next(rng);
        if (r >= threshold) return (size_t)(r % n);
    }
}

void text_windows(const text_data *t, bool valid, int B, int T, ag_pcg32 *rng, int32_t *ids,
                  int32_t *targets) {
    size_t lo = valid ? t->train_len : 0, hi = valid ? t->len : t->train_len;
    for (int b = 0; b < B; b++) {
        size_t s = lo + text_window_start(hi - lo - (size_t)T, rng);
        for (int i = 0; i < T; i++) {
            ids[b * T + i] = t->bytes[s + (size_t)i];
            targets[b * T + i] = t->bytes[s + (size_t)i + 1];
        }
    }
}

const char *text_fingerprint(const text_data *t) {
    static char out[64];
    uint64_t h = fnv1a(FNV1A_START, t->bytes, t->len);
    snprintf(out, sizeof out, "%zu bytes, FNV-1a hash %016llx", t->len, (unsigned long long)h);
    return out;
}

bool text_check_fingerprint(const text_data *t, const char *path, const ag_safetensors *file,
                            const char *ckpt, bool chosen, ag_err *err) {
    const char *now = text_fingerprint(t), *then = ag_safetensors_meta(file, "data-text");
    then = then ? then : "an unrecorded text";
    if (!strcmp(now, then)) return true;
    if (chosen) {
        printf("data: training on %s, not on the %s %s was trained on\n", now, then, ckpt);
        return true;
    }
    snprintf(err->msg, sizeof err->msg, "%.150s: %s, but %.150s was trained on %s (give --data "
             "to train on it)", path, now, ckpt, then);
    return false;
}

bool text_batch_new(text_batch *b, int B, int T, int part, int parts) {
    const int first = part * (B / parts) + (part < B % parts ? part : B % parts);
    const size_t n = (size_t)B * (size_t)T;
    *b = (text_batch){.B = B, .T = T, .first = first, .count = B / parts + (part < B % parts)};
    b->ids = malloc(sizeof(int32_t) * n);
    b->targets = malloc(sizeof(int32_t) * n);
    if (!b->ids || !b->targets) {  // unchecked, the windows were written through NULL
        text_batch_free(b);
        return false;
    }
    b->my_ids = b->ids + (size_t)first * (size_t)T;
    b->my_targets = b->targets + (size_t)first * (size_t)T;
    return true;
}

void text_batch_free(text_batch *b) {
    free(b->ids);
    free(b->targets);
    *b = (text_batch){0};
}

void text_batch_draw(text_batch *b, const text_data *t, bool valid, ag_pcg32 *rng) {
    text_windows(t, valid, b->B, b->T, rng, b->ids, b->targets);
}

void text_print_summary(const text_data *t, const char *path) {
    printf("data: %s, %zu bytes (%zu train, %zu validation)\n", path, t->len, t->train_len,
           t->len - t->train_len);
    printf("baselines, validation bits/byte: unigram %.3f, bigram %.3f\n", text_unigram_bits(t),
           text_bigram_bits(t));
}

#define ALPHA 0.1

double text_unigram_bits(const text_data *t) {
    double count[256] = {0};
    for (size_t i = 0; i < t->train_len; i++) count[t->bytes[i]]++;
    double total = (double)t->train_len + 256 * ALPHA, bits = 0;
    for (size_t i = t->train_len; i < t->len; i++)
        bits -= log2((count[t->bytes[i]] + ALPHA) / total);
    return bits / (double)(t->len - t->train_len);
}

double text_bigram_bits(const text_data *t) {
    static double count[256][256];
    double row[256] = {0};
    memset(count, 0, sizeof count);
    for (size_t i = 1; i < t->train_len; i++) {
        count[t->bytes[i - 1]][t->bytes[i]]++;
        row[t->bytes[i - 1]]++;
    }
    double bits = 0;
    for (size_t i = t->train_len + 1; i < t->len; i++) {
        uint8_t a = t->bytes[i - 1], b = t->bytes[i];
        bits -= log2((count[a][b] + ALPHA) / (row[a] + 256 * ALPHA));
    }
    return bits / (double)(t->len - t->train_len - 1);
}
