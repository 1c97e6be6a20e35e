// Writing a dataset file (format: datasets/README.md), atomically: the bytes
// go to a temporary file in the same directory, which is flushed to disk and
// then renamed over the destination. rename() within one directory replaces
// the old file in one step, so a crash leaves either the old file or the new
// one, never a half-written one.
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "seqdata_internal.h"

static void write_header(FILE *f, const ag_seqdata *d) {
    char what[512];
    agi_task_describe(d, what, sizeof what);
    fprintf(f, "%s\n", AGI_SEQ_MAGIC);
    for (const char *line = what; *line;) {  // each line of the description as a comment
        size_t n = strcspn(line, "\n");
        fprintf(f, "# %.*s\n", (int)n, line);
        line += n + (line[n] == '\n');
    }
    fprintf(f, "# A token's id is its position in the alphabet: '0' is 0, '|' is %d%s.\n",
            d->sep_token, d->task == AG_TASK_RECALL ? ", 'a' is 11" : "");
    fprintf(f, "# Format: datasets/README.md in attograd.\n");
    fprintf(f, "task %s\n", ag_task_name(d->task));
    fprintf(f, "alphabet %s\n", d->alphabet);
    fprintf(f, "separator %c\n", d->alphabet[d->sep_token]);
    fprintf(f, "length %d\n", d->length);
    fprintf(f, "count %d\n", d->count);
    if (d->has_seed)
        fprintf(f, "seed %llu stream %llu\n", (unsigned long long)d->seed,
                (unsigned long long)d->stream);
    fprintf(f, "data\n");
}

static void write_rows(FILE *f, const ag_seqdata *d) {
    char line[2 * AG_SEQ_MAX_LENGTH + 2];
    for (int i = 0; i < d->count; i++) {
        const int32_t *s = d->tokens + (size_t)i * (size_t)d->seq_len;
        for (int t = 0; t < d->seq_len; t++) line[t] = d->alphabet[s[t]];
        line[d->seq_len] = '\n';
        fwrite(line, 1, (size_t)d->seq_len + 1, f);
    }
}

// A dataset save would write, or the reason it must not.
static int check_dataset(const ag_seqdata *d, const char *path, ag_err *err) {
    if (!d || !d->tokens) return agi_seq_fail(err, path, 0, "not saved: the dataset is NULL");
    if (!agi_task_valid(d->task) || d->length < 1 || d->length > agi_task_max_length(d->task))
        return agi_seq_fail(err, path, 0, "not saved: bad task %d or length %d", (int)d->task,
                            d->length);
    if (d->count < 1 || d->count > AG_SEQ_MAX_COUNT)
        return agi_seq_fail(err, path, 0, "not saved: count %d out of range: 1 to %d", d->count,
                            AG_SEQ_MAX_COUNT);
    ag_seqdata layout = {0};
    agi_task_layout(&layout, d->task, d->length);
    if (layout.seq_len != d->seq_len || !d->alphabet || strcmp(layout.alphabet, d->alphabet) != 0)
        return agi_seq_fail(err, path, 0,
                            "not saved: the layout fields do not match task %s, length %d",
                            ag_task_name(d->task), d->length);
    char problem[300];
    for (int i = 0; i < d->count; i++) {
        if (agi_task_check(d, d->tokens + (size_t)i * (size_t)d->seq_len, problem, sizeof problem))
            return agi_seq_fail(err, path, 0,
                                "not saved: sequence %d is not a valid %s sequence: %s", i,
                                ag_task_name(d->task), problem);
    }
    return 0;
}

// Opens a fresh temporary file next to `path` (same directory, so rename is
// atomic), named <path>.tmp-<pid>-<n>; O_EXCL makes concurrent savers pick
// different names. Mode 0666 lets the umask decide, as for any new file.
static int open_temp(const char *path, char *tmp, size_t size) {
    for (int attempt = 0; attempt < 100; attempt++) {
        if (snprintf(tmp, size, "%s.tmp-%ld-%d", path, (long)getpid(), attempt) >= (int)size) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

// Best effort: makes the rename itself durable by syncing the directory.
static void sync_parent_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, sizeof dir, ".");
    } else {
        size_t n = (size_t)(slash - path);
        if (n == 0) n = 1;  // "/file": the root
        if (n >= sizeof dir) return;
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    int fd = open(dir, O_RDONLY);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
}

int ag_seqdata_save(const ag_seqdata *d, const char *path, ag_err *err) {
    if (!path) return agi_seq_fail(err, NULL, 0, "not saved: path is NULL");
    if (check_dataset(d, path, err)) return -1;

    char tmp[4096];
    int fd = open_temp(path, tmp, sizeof tmp);
    if (fd < 0)
        return agi_seq_fail(err, path, 0, "cannot create a temporary file next to it: %s",
                            strerror(errno));
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return agi_seq_fail(err, path, 0, "cannot write: %s", strerror(e));
    }
    write_header(f, d);
    write_rows(f, d);
    // Any failed write sets the stream's error flag; fflush, fsync and fclose
    // then report what the disk said (ENOSPC, EIO).
    int bad = ferror(f) || fflush(f) != 0 || fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        unlink(tmp);
        return agi_seq_fail(err, path, 0, "write failed: %s", strerror(e));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return agi_seq_fail(err, path, 0, "cannot replace it with the new file: %s", strerror(e));
    }
    sync_parent_dir(path);
    return 0;
}
