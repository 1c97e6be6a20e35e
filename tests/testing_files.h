// Scratch files for tests that read and write files: one private directory
// per test executable (under $TMPDIR or /tmp), emptied and removed at the end.
// Include after defining _POSIX_C_SOURCE (these helpers use POSIX calls).
#ifndef ATTOGRAD_TESTING_FILES_H
#define ATTOGRAD_TESTING_FILES_H

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char testing_dir[512];

static inline const char *testing_tmpdir(void) {
    if (!testing_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(testing_dir, sizeof testing_dir, "%s/attograd_test_XXXXXX",
                 base && *base ? base : "/tmp");
        if (!mkdtemp(testing_dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    return testing_dir;
}

// dir/name, in one of a few rotating buffers.
static inline const char *testing_path(const char *name) {
    static char bufs[4][640];
    static int next;
    char *b = bufs[next];
    next = (next + 1) % 4;
    snprintf(b, sizeof bufs[0], "%s/%s", testing_tmpdir(), name);
    return b;
}

static inline void testing_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

// The whole file (malloc'd, *n bytes, followed by a NUL that *n does not
// count, so text files can be searched as strings), or NULL if it cannot be read.
static inline unsigned char *testing_read_file(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    unsigned char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    buf[len] = 0;  // len < cap: the loop grows the buffer whenever it fills
    *n = len;
    return buf;
}

// Entries of the scratch directory whose name contains `part`.
static inline int testing_count_files(const char *part) {
    DIR *d = opendir(testing_tmpdir());
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strstr(e->d_name, part)) n++;
    if (d) closedir(d);
    return n;
}

// Removes the entries of the scratch directory whose name contains `part`.
static inline void testing_remove_files(const char *part) {
    DIR *d = opendir(testing_tmpdir());
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strstr(e->d_name, part)) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", testing_dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
}

// Removes the scratch directory and what it holds (one level of
// subdirectories, emptied first).
static inline void testing_remove_tmpdir(void) {
    if (!testing_dir[0]) return;
    DIR *d = opendir(testing_dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", testing_dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            chmod(path, 0700);
            DIR *sub = opendir(path);
            for (struct dirent *s; sub && (s = readdir(sub));) {
                if (!strcmp(s->d_name, ".") || !strcmp(s->d_name, "..")) continue;
                char inner[1400];
                snprintf(inner, sizeof inner, "%s/%s", path, s->d_name);
                unlink(inner);
            }
            if (sub) closedir(sub);
            rmdir(path);
        } else {
            unlink(path);
        }
    }
    if (d) closedir(d);
    rmdir(testing_dir);
    testing_dir[0] = 0;
}

// A file-size limit (RLIMIT_FSIZE) that makes every write past `bytes` fail
// with EFBIG, as on a full disk; SIGXFSZ is ignored, so the write returns the
// error rather than killing the process. Undo with testing_file_size_restore.
typedef struct testing_file_size {
    struct rlimit saved;
    void (*handler)(int);
} testing_file_size;

static inline testing_file_size testing_file_size_limit(rlim_t bytes) {
    testing_file_size f;
    f.handler = signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &f.saved);
    struct rlimit limited = f.saved;
    limited.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limited);
    return f;
}

static inline void testing_file_size_restore(testing_file_size f) {
    setrlimit(RLIMIT_FSIZE, &f.saved);
    signal(SIGXFSZ, f.handler);
}

#endif
