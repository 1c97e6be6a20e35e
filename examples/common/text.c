#define _POSIX_C_SOURCE 200809L  // openat, fdopendir
#include "text.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fnv1a.h"

// One line into err: the path, then the problem. A path past 200 bytes (up to PATH_MAX,
// or past it by mistake) filled the line and cut the problem off: it is shown as its
// first 80 bytes, "...", and its last 100, where the file's name is.
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void fail(ag_err *err, const char *path, const char *fmt, ...) {
    const size_t n = strlen(path);
    const int at = n <= 200 ? snprintf(err->msg, sizeof err->msg, "%s: ", path)
                            : snprintf(err->msg, sizeof err->msg, "%.80s...%.100s: ", path,
                                       path + n - 100);
    if (at < 0 || (size_t)at >= sizeof err->msg) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + at, sizeof err->msg - (size_t)at, fmt, ap);
    va_end(ap);
}

// The file at `path` (in the directory open as `dir_fd`, or AT_FDCWD), opened for
// reading as what it is when opened: without blocking, as a FIFO would wait for a writer,
// and close-on-exec, as another thread's child must not inherit it. Checked through the
// descriptor, never the name: a name checked and then opened can be another file by then.
// *st gets what was opened. -1 with errno when it cannot be opened.
static int open_checked(int dir_fd, const char *path, int flags, struct stat *st) {
    const int fd = openat(dir_fd, path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | flags);
    if (fd < 0) return -1;
    if (fstat(fd, st) != 0) {
        const int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

// Appends the regular file open as fd (and closes it) to t->bytes: the `size` bytes it
// held when opened, and no more, as a file still being written (a log) would otherwise be
// read for as long as it grows, without bound. `path` names it.
static bool append_file(text_data *t, int fd, off_t size, const char *path, ag_err *err) {
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        fail(err, path, "%s", strerror(errno));
        close(fd);
        return false;
    }
    if (size <= 0) {  // nothing to read, and realloc(p, 0) may free p
        fclose(f);
        return true;
    }
    uint8_t *grown =
        (uintmax_t)size <= SIZE_MAX - t->len ? realloc(t->bytes, t->len + (size_t)size) : NULL;
    if (!grown) {
        fclose(f);
        fail(err, path, "out of memory for its %jd bytes", (intmax_t)size);
        return false;
    }
    t->bytes = grown;
    // A file cut short meanwhile gives what it still held.
    size_t want = (size_t)size, n;
    while (want > 0 && (n = fread(t->bytes + t->len, 1, want, f)) > 0) {
        t->len += n;
        want -= n;
    }
    bool ok = !ferror(f);
    fclose(f);
    if (!ok) fail(err, path, "read error");
    return ok;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Appends the regular files of the directory open as fd (and closes it), in name order;
// links are not followed, and what is not a regular file when opened is skipped.
static bool append_directory(text_data *t, int fd, const char *path, ag_err *err) {
    DIR *d = fdopendir(fd);
    if (!d) {
        fail(err, path, "%s", strerror(errno));
        close(fd);
        return false;
    }
    char **names = NULL;
    size_t n = 0;
    bool ok = true;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char *name = malloc(strlen(e->d_name) + 1);
        char **grown = name ? realloc(names, (n + 1) * sizeof *names) : NULL;
        if (!grown) {
            fail(err, path, "out of memory listing its files");
            free(name);
            ok = false;
            break;
        }
        names = grown;
        names[n++] = strcpy(name, e->d_name);
    }
    if (n) qsort(names, n, sizeof *names, by_name);  // names is NULL for an empty directory
    for (size_t i = 0; i < n; i++) {
        const size_t len = strlen(path) + strlen(names[i]) + 2;
        char *full = ok ? malloc(len) : NULL;
        if (full) snprintf(full, len, "%s/%s", path, names[i]);
        struct stat st;
        // O_NOFOLLOW: a link fails with ELOOP, and is skipped like a socket (ENXIO), a file
        // removed since the listing (ENOENT), and what is opened and found no regular file.
        const int file = full ? open_checked(dirfd(d), names[i], O_NOFOLLOW, &st) : -1;
        if (file >= 0 && S_ISREG(st.st_mode)) {
            ok = append_file(t, file, st.st_size, full, err);
        } else if (file >= 0) {
            close(file);
        } else if (full && errno != ELOOP && errno != ENXIO && errno != ENOENT) {
            fail(err, full, "%s", strerror(errno));
            ok = false;
        } else if (ok && !full) {
            fail(err, path, "out of memory listing its files");
            ok = false;
        }
        free(full);
        free(names[i]);
    }
    free(names);
    closedir(d);
    return ok;
}

bool text_load(text_data *t, const char *path, double valid_fraction, size_t min_split,
               ag_err *err) {
    *t = (text_data){0};
    struct stat st;
    const int fd = open_checked(AT_FDCWD, path, 0, &st);
    if (fd < 0) {
        fail(err, path, "%s", strerror(errno));
        return false;
    }
    // A FIFO would wait for a writer and a device (/dev/zero) never end: a directory's
    // regular files are read, and a path given must be one of the two.
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        fail(err, path, "is neither a regular file nor a directory");
        close(fd);
        return false;
    }
    if (!(S_ISDIR(st.st_mode) ? append_directory(t, fd, path, err)
                              : append_file(t, fd, st.st_size, path, err))) {
        text_free(t);
        return false;
    }
    size_t valid = (size_t)((double)t->len * valid_fraction);
    t->train_len = t->len - valid;
    if (t->len == 0 || valid < min_split || t->train_len < min_split) {
        fail(err, path,
             "%zu bytes is too little text: each of training and validation needs at least %zu",
             t->len, min_split);
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
