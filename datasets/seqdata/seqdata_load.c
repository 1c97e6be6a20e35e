// Reading a dataset file (format: datasets/README.md). The reader trusts
// nothing: every header line, every character and every sequence is checked,
// the first problem is reported as "<path>:<line>: <problem>", and memory
// grows only with the lines actually read (never with a count the header
// claims), so no input can make it crash, abort or allocate without bound.
#define _POSIX_C_SOURCE 200809L  // fstat, fdopen

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seqdata_internal.h"

// Header lines are short ("alphabet 0123456789|abcdefghijklmnop" is the
// longest a valid file has); anything near this limit is not a header.
enum { HEADER_MAX = 256 };
// Reading a line stops after this many bytes, so an endless stream without
// newlines (say /dev/zero) ends in an error rather than an endless loop.
enum { LINE_LIMIT = 1 << 20 };

typedef struct reader {
    FILE *f;
    const char *path;
    long line;  // number of the line read last, from 1
    ag_err *err;
} reader;

// Reports "<path>:<line>: <problem>" into r->err.
static void fail_at(reader *r, long line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void fail_at(reader *r, long line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    seq_vfail(r->err, r->path, line, fmt, ap);
    va_end(ap);
}

// Reads the next line into buf (at most cap-1 bytes kept, NUL-terminated) and
// returns its full length: bytes past the buffer are counted and dropped, so
// a long line costs no memory; past LINE_LIMIT bytes it stops and returns
// LINE_LIMIT + 1. A CR right before the LF is not part of the line (CRLF
// files load like LF files). Returns -1 at the end of the file (or on a read
// error, which r->f's error flag then shows). *newline says whether the line
// ended with LF.
static long next_line(reader *r, char *buf, size_t cap, bool *newline) {
    long len = 0;
    int c, prev = EOF;
    *newline = false;
    while ((c = getc(r->f)) != EOF) {
        if (c == '\n') {
            *newline = true;
            break;
        }
        if ((size_t)len < cap - 1) buf[len] = (char)c;
        prev = c;
        if (++len > LINE_LIMIT) break;
    }
    if (c == EOF && len == 0) return -1;
    r->line++;
    if (*newline && prev == '\r') len--;  // CRLF: drop the CR
    buf[(size_t)len < cap - 1 ? (size_t)len : cap - 1] = 0;
    return len;
}

// A value quoted for a message: printable bytes as they are, others as
// \xNN, cut after 40 bytes.
static const char *quoted(const char *s, size_t n, char out[200]) {
    size_t o = 0;
    out[o++] = '\'';
    for (size_t i = 0; i < n && i < 40; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, 8, "\\x%02x", c);
    }
    out[o++] = '\'';
    if (n > 40) o += (size_t)snprintf(out + o, 8, "...");
    out[o] = 0;
    return out;
}

// A decimal number without sign or spaces, in [lo, hi].
static bool parse_u64(const char *s, uint64_t hi, uint64_t *out) {
    uint64_t v = 0;
    if (!*s) return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return false;
        unsigned digit = (unsigned)(*s - '0');
        if (v > (hi - digit) / 10) return false;
        v = v * 10 + digit;
    }
    *out = v;
    return true;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    uint64_t v;
    if (!parse_u64(s, (uint64_t)hi, &v) || v < (uint64_t)lo) return false;
    *out = (int)v;
    return true;
}

// ---- The header ------------------------------------------------------------------------
// The keys in the order they must appear; "seed" may be left out.
enum { K_TASK, K_ALPHABET, K_SEPARATOR, K_LENGTH, K_COUNT, K_SEED, K_DATA, N_KEYS };
static const char *const key_names[N_KEYS] = {"task",  "alphabet", "separator", "length",
                                              "count", "seed",     "data"};

// Parses one "key value" line into d; `next` is the key expected here.
// Returns the key read, or -1 after reporting a problem.
static int header_line(reader *r, ag_seqdata *d, int next, char *line, long len) {
    char q[200], q2[200];
    if (len == 0) {
        fail_at(r, r->line, "empty line in the header, where '%s' belongs", key_names[next]);
        return -1;
    }
    char *space = strchr(line, ' ');
    size_t key_len = space ? (size_t)(space - line) : (size_t)len;
    const char *value = space ? space + 1 : "";
    int k = 0;
    while (k < N_KEYS &&
           !(strlen(key_names[k]) == key_len && memcmp(line, key_names[k], key_len) == 0))
        k++;
    if (k == N_KEYS) {
        fail_at(r, r->line, "unknown header key %s, where '%s' belongs", quoted(line, key_len, q),
                key_names[next]);
        return -1;
    }
    if (k < next) {
        fail_at(r, r->line, "header '%s' appears twice", key_names[k]);
        return -1;
    }
    if (k == K_DATA && next < K_SEED) {
        fail_at(r, r->line, "missing header '%s' before 'data'", key_names[next]);
        return -1;
    }
    if (k > next && !(next == K_SEED && k == K_DATA)) {
        fail_at(r, r->line, "header '%s' out of order: '%s' belongs here", key_names[k],
                key_names[next]);
        return -1;
    }
    if (k == K_DATA) {
        if (space)
            fail_at(r, r->line, "'data' takes no value: the sequences start on the next line");
        return space ? -1 : k;
    }
    if (!*value) {
        fail_at(r, r->line, "header '%s' has no value", key_names[k]);
        return -1;
    }
    const char *task = ag_task_name(d->task);
    switch (k) {
    case K_TASK:
        if (ag_task_from_name(value, &d->task) == 0) return k;
        fail_at(r, r->line, "unknown task %s (known: copy, reverse, recall)",
                quoted(value, strlen(value), q));
        return -1;
    case K_ALPHABET:
        if (strcmp(value, seq_task_alphabet(d->task)) == 0) return k;
        fail_at(r, r->line, "alphabet %s differs from the alphabet of task %s, %s",
                quoted(value, strlen(value), q), task,
                quoted(seq_task_alphabet(d->task), strlen(seq_task_alphabet(d->task)), q2));
        return -1;
    case K_SEPARATOR:
        if (strcmp(value, "|") == 0) return k;
        fail_at(r, r->line, "separator %s differs from the separator of task %s, '|'",
                quoted(value, strlen(value), q), task);
        return -1;
    case K_LENGTH:
        if (parse_int(value, 1, seq_task_max_length(d->task), &d->length)) return k;
        fail_at(r, r->line, "length %s is not a whole number from 1 to %d (the range of task %s)",
                quoted(value, strlen(value), q), seq_task_max_length(d->task), task);
        return -1;
    case K_COUNT:
        if (parse_int(value, 1, AG_SEQ_MAX_COUNT, &d->count)) return k;
        fail_at(r, r->line, "count %s is not a whole number from 1 to %d",
                quoted(value, strlen(value), q), AG_SEQ_MAX_COUNT);
        return -1;
    case K_SEED: {
        // "seed <number> stream <number>"
        char seed[32], stream[32];
        const char *mid = strstr(value, " stream ");
        size_t n1 = mid ? (size_t)(mid - value) : 0;
        const char *rest = mid ? mid + 8 : "";
        if (mid && n1 < sizeof seed && strlen(rest) < sizeof stream) {
            memcpy(seed, value, n1);
            seed[n1] = 0;
            snprintf(stream, sizeof stream, "%s", rest);
            if (parse_u64(seed, UINT64_MAX, &d->seed) &&
                parse_u64(stream, UINT64_MAX, &d->stream)) {
                d->has_seed = true;
                return k;
            }
        }
        fail_at(r, r->line, "expected 'seed <number> stream <number>', found %s",
                quoted(line, (size_t)len, q));
        return -1;
    }
    }
    return -1;
}

// Reads from the magic line through "data"; fills d's layout, count and seed.
static int read_header(reader *r, ag_seqdata *d) {
    char line[HEADER_MAX], q[200];
    bool newline;
    long len = next_line(r, line, sizeof line, &newline);
    if (len < 0) {
        if (ferror(r->f))
            fail_at(r, 1, "read error: %s", strerror(errno));
        else
            fail_at(r, 1, "empty file");
        return -1;
    }
    if (len != (long)strlen(line) || strcmp(line, SEQ_MAGIC) != 0) {
        const char *prefix = "# attograd sequence dataset ";
        if (strncmp(line, prefix, strlen(prefix)) == 0)
            fail_at(r, 1, "unsupported format version %s (this reader knows v1)",
                    quoted(line + strlen(prefix), strlen(line + strlen(prefix)), q));
        else
            fail_at(r, 1, "not an attograd sequence dataset: the first line must be '%s'",
                    SEQ_MAGIC);
        return -1;
    }
    int next = K_TASK;
    for (;;) {
        if (!newline) {
            fail_at(r, r->line, "file ends inside the header (truncated file?)");
            return -1;
        }
        len = next_line(r, line, sizeof line, &newline);
        if (len < 0) {
            if (ferror(r->f))
                fail_at(r, r->line + 1, "read error: %s", strerror(errno));
            else
                fail_at(r, r->line + 1,
                        "file ends inside the header, where '%s' belongs (truncated file?)",
                        key_names[next]);
            return -1;
        }
        if (len >= HEADER_MAX) {
            fail_at(r, r->line, "header line longer than %d characters", HEADER_MAX - 1);
            return -1;
        }
        if (len != (long)strlen(line)) {
            fail_at(r, r->line, "NUL byte in the header");
            return -1;
        }
        if (line[0] == '#') continue;  // a comment
        int k = header_line(r, d, next, line, len);
        if (k < 0) return -1;
        if (k == K_DATA) break;
        next = k + 1;
    }
    if (!newline) {
        fail_at(r, r->line, "file ends right after 'data' (truncated file?)");
        return -1;
    }
    seq_task_layout(d, d->task, d->length);
    return 0;
}

// ---- The sequences ------------------------------------------------------------------------
// What a line of d looks like, for the wrong-length message.
static void describe_layout(const ag_seqdata *d, char *buf, size_t size) {
    if (d->task == AG_TASK_RECALL)
        snprintf(buf, size, "%d key-value pairs, '|', a key, a value", d->length);
    else
        snprintf(buf, size, "%d symbols, '|', %d symbols", d->length, d->length);
}

static int read_sequences(reader *r, ag_seqdata *d) {
    int N = d->seq_len;
    char line[2 * AG_SEQ_MAX_LENGTH + 8], layout[96], c[16], problem[300];
    int32_t token_of[256];
    for (int i = 0; i < 256; i++) token_of[i] = -1;
    for (int i = 0; i < d->vocab; i++) token_of[(unsigned char)d->alphabet[i]] = i;
    describe_layout(d, layout, sizeof layout);

    int cap = 0;
    bool newline;
    for (int row = 0; row < d->count; row++) {
        long len = next_line(r, line, sizeof line, &newline);
        if (len < 0) {
            if (ferror(r->f))
                fail_at(r, r->line + 1, "read error: %s", strerror(errno));
            else
                fail_at(r, r->line + 1,
                        "file ends after %d of the %d sequences the header's count "
                        "promises (truncated file?)",
                        row, d->count);
            return -1;
        }
        if (!newline && len < N) {
            seq_fail(
                r->err, r->path, r->line,
                "file ends in the middle of a line: %ld of %d characters (truncated file?)", len,
                N);
            return -1;
        }
        if (len == 0) {
            fail_at(r, r->line, "empty line where sequence %d of %d belongs", row + 1, d->count);
            return -1;
        }
        if (len > LINE_LIMIT) {
            fail_at(r, r->line, "line has more than %d characters, expected %d (%s)", LINE_LIMIT,
                    N, layout);
            return -1;
        }
        if (len != N) {
            fail_at(r, r->line, "line has %ld characters, expected %d (%s)", len, N, layout);
            return -1;
        }
        if (row == cap) {  // grow with what was read, never with the claimed count
            int new_cap =
                cap ? (cap > d->count / 2 ? d->count : 2 * cap) : (d->count < 256 ? d->count : 256);
            int32_t *grown = seq_malloc((size_t)new_cap * (size_t)N * sizeof *grown);
            if (d->tokens) memcpy(grown, d->tokens, (size_t)cap * (size_t)N * sizeof *grown);
            free(d->tokens);
            d->tokens = grown;
            cap = new_cap;
        }
        int32_t *s = d->tokens + (size_t)row * (size_t)N;
        for (int t = 0; t < N; t++) {
            s[t] = token_of[(unsigned char)line[t]];
            if (s[t] < 0) {
                fail_at(r, r->line, "column %d: %s is not in the alphabet '%s'", t + 1,
                        seq_describe_char((unsigned char)line[t], c), d->alphabet);
                return -1;
            }
        }
        if (seq_task_check(d, s, problem, sizeof problem)) {
            fail_at(r, r->line, "%s", problem);
            return -1;
        }
        if (!newline) {
            fail_at(r, r->line, "the last line has no newline at its end (truncated file?)");
            return -1;
        }
    }
    long len = next_line(r, line, sizeof line, &newline);
    if (len >= 0) {
        seq_fail(
            r->err, r->path, r->line,
            "more lines than the header's count of %d sequences; expected the end of the file",
            d->count);
        return -1;
    }
    if (ferror(r->f)) {
        fail_at(r, r->line + 1, "read error: %s", strerror(errno));
        return -1;
    }
    return 0;
}

ag_seqdata *ag_seqdata_load(const char *path, ag_err *err) {
    if (!path) {
        seq_fail(err, NULL, 0, "path is NULL");
        return NULL;
    }
    if (!*path) {  // else the line began ": cannot open", naming no file
        if (err) snprintf(err->msg, sizeof err->msg, "the path is empty; name a dataset file");
        return NULL;
    }
    // Only a regular file is read: opening a FIFO waits for a writer, and a device
    // (/dev/zero) never ends. Opened without blocking and checked through its descriptor,
    // not its name: a name checked and then opened can be another file by then (a FIFO
    // hung the open). Close-on-exec: another thread's child must not inherit it.
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        seq_fail(err, path, 0, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    const bool known = fstat(fd, &st) == 0;
    if (!known || !S_ISREG(st.st_mode)) {
        if (known)
            seq_fail(err, path, 0, "is not a regular file");
        else
            seq_fail(err, path, 0, "cannot stat: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        seq_fail(err, path, 0, "cannot read: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    reader r = {f, path, 0, err};
    ag_seqdata *d = seq_calloc(sizeof *d);
    int bad = read_header(&r, d) || read_sequences(&r, d);
    fclose(f);
    if (bad) {
        ag_seqdata_free(d);
        return NULL;
    }
    return d;
}

ag_seqdata *ag_seqdata_load_task(const char *path, ag_task task, ag_err *err) {
    ag_seqdata *d = ag_seqdata_load(path, err);
    if (d && d->task != task) {
        seq_fail(err, path, 0, "a %s dataset, where a %s dataset was expected",
                 ag_task_name(d->task), ag_task_name(task));
        ag_seqdata_free(d);
        return NULL;
    }
    return d;
}
