// Writing a dataset file (format: datasets/README.md), atomically through
// ag_file_writer (attograd/io.h): a crash leaves either the old file or the new one,
// never a half-written one. The text is staged in a buffer, so the file gets
// a few large writes rather than one per line.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "seqdata_internal.h"

#define STAGE_SIZE (1u << 16)  // more than the longest line

typedef struct stage {
    ag_file_writer *af;
    char *buf;
    size_t len;
} stage;

static void stage_flush(stage *s) {
    ag_file_writer_write(s->af, s->buf, s->len);
    s->len = 0;
}

static void stage_bytes(stage *s, const char *bytes, size_t n) {
    if (s->len + n > STAGE_SIZE) stage_flush(s);
    memcpy(s->buf + s->len, bytes, n);
    s->len += n;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void stage_printf(stage *s, const char *fmt, ...) {
    char line[1024];  // header lines are at most a description line (< 512) and a prefix
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0) stage_bytes(s, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void write_header(stage *s, const ag_seqdata *d) {
    char what[512];
    seq_task_describe(d, what, sizeof what);
    stage_printf(s, "%s\n", SEQ_MAGIC);
    for (const char *line = what; *line;) {  // each line of the description as a comment
        size_t n = strcspn(line, "\n");
        stage_printf(s, "# %.*s\n", (int)n, line);
        line += n + (line[n] == '\n');
    }
    stage_printf(s, "# A token's id is its position in the alphabet: '0' is 0, '|' is %d%s.\n",
                 d->sep_token, d->task == AG_TASK_RECALL ? ", 'a' is 11" : "");
    stage_printf(s, "# Format: datasets/README.md in attograd.\n");
    stage_printf(s, "task %s\n", ag_task_name(d->task));
    stage_printf(s, "alphabet %s\n", d->alphabet);
    stage_printf(s, "separator %c\n", d->alphabet[d->sep_token]);
    stage_printf(s, "length %d\n", d->length);
    stage_printf(s, "count %d\n", d->count);
    if (d->has_seed)
        stage_printf(s, "seed %llu stream %llu\n", (unsigned long long)d->seed,
                     (unsigned long long)d->stream);
    stage_printf(s, "data\n");
}

static void write_rows(stage *s, const ag_seqdata *d) {
    char line[2 * AG_SEQ_MAX_LENGTH + 2];
    for (int i = 0; i < d->count; i++) {
        const int32_t *seq = d->tokens + (size_t)i * (size_t)d->seq_len;
        for (int t = 0; t < d->seq_len; t++) line[t] = d->alphabet[seq[t]];
        line[d->seq_len] = '\n';
        stage_bytes(s, line, (size_t)d->seq_len + 1);
    }
}

// A dataset save would write, or the reason it must not.
static int check_dataset(const ag_seqdata *d, const char *path, ag_err *err) {
    if (!d || !d->tokens) return seq_fail(err, path, 0, "not saved: the dataset is NULL");
    if (!seq_task_valid(d->task) || d->length < 1 || d->length > seq_task_max_length(d->task))
        return seq_fail(err, path, 0, "not saved: bad task %d or length %d", (int)d->task,
                            d->length);
    if (d->count < 1 || d->count > AG_SEQ_MAX_COUNT)
        return seq_fail(err, path, 0, "not saved: count %d out of range: 1 to %d", d->count,
                            AG_SEQ_MAX_COUNT);
    ag_seqdata layout = {0};
    seq_task_layout(&layout, d->task, d->length);
    if (layout.seq_len != d->seq_len || !d->alphabet || strcmp(layout.alphabet, d->alphabet) != 0)
        return seq_fail(err, path, 0,
                            "not saved: the layout fields do not match task %s, length %d",
                            ag_task_name(d->task), d->length);
    char problem[300];
    for (int i = 0; i < d->count; i++) {
        if (seq_task_check(d, d->tokens + (size_t)i * (size_t)d->seq_len, problem, sizeof problem))
            return seq_fail(err, path, 0,
                                "not saved: sequence %d is not a valid %s sequence: %s", i,
                                ag_task_name(d->task), problem);
    }
    return 0;
}

int ag_seqdata_save(const ag_seqdata *d, const char *path, ag_err *err) {
    if (!path) return seq_fail(err, NULL, 0, "not saved: path is NULL");
    if (check_dataset(d, path, err)) return -1;
    ag_file_writer *af = ag_file_writer_open(path, err);
    if (!af) return -1;
    stage s = {af, seq_malloc(STAGE_SIZE), 0};
    write_header(&s, d);
    write_rows(&s, d);
    stage_flush(&s);
    free(s.buf);
    return ag_file_writer_commit(af, err);
}
