// Scratch files for tests that read and write files: one private directory
// per test executable (under $TMPDIR or /tmp), emptied and removed at the end.
// Include after defining _POSIX_C_SOURCE (these helpers use POSIX calls).
#ifndef ATTOGRAD_TESTING_FILES_H
#define ATTOGRAD_TESTING_FILES_H

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

// Runs fn(arg) in a child process: whether it returned within `seconds` (its return
// value in *status), or hung and was killed. For calls that, wrong, would block forever.
static inline bool testing_returns_within(int (*fn)(void *), void *arg, double seconds,
                                          int *status) {
    fflush(NULL);  // the child must not write the parent's buffered output again
    const pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) _exit(fn(arg));
    int ws = 0;
    for (double waited = 0; waited < seconds; waited += 0.01) {
        if (waitpid(pid, &ws, WNOHANG) == pid) {
            *status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
            return true;
        }
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &ws, 0);
    *status = -1;
    return false;
}

#ifdef AG_TEST_FILE_HOOKS
// Hooks on the C library's file calls, for what a reader does between them: the test
// executables that define AG_TEST_FILE_HOOKS are linked with
// -Wl,--wrap=stat,--wrap=lstat,--wrap=fread,--wrap=fclose (tests/CMakeLists.txt), so
// the library's calls come here first.
int __real_stat(const char *path, struct stat *sb);
int __real_lstat(const char *path, struct stat *sb);
size_t __real_fread(void *dst, size_t size, size_t n, FILE *f);
int __real_fclose(FILE *f);

// Armed by setting both: right after the next stat or lstat of testing_swap_path,
// testing_swap_with is renamed over it, as another process could do between a
// reader's check of a name and its opening of that name.
static const char *testing_swap_path, *testing_swap_with;
// Files closed with fclose since these were zeroed, and how many of their descriptors
// lacked close-on-exec (leaked into any program another thread runs meanwhile).
static int testing_fclose_count, testing_fclose_inheritable;
// Armed by setting it: every fread first appends testing_grow_bytes bytes to this file,
// as a writer still writing it would, testing_grow_left more times.
static const char *testing_grow_path;
static size_t testing_grow_bytes;
static int testing_grow_left;

static inline void testing_swap_now(const char *path) {
    if (testing_swap_path && testing_swap_with && strcmp(path, testing_swap_path) == 0) {
        if (rename(testing_swap_with, testing_swap_path) != 0) perror("rename");
        testing_swap_path = testing_swap_with = NULL;
    }
}

int __wrap_stat(const char *path, struct stat *sb);
int __wrap_stat(const char *path, struct stat *sb) {
    const int rc = __real_stat(path, sb);
    testing_swap_now(path);
    return rc;
}

int __wrap_lstat(const char *path, struct stat *sb);
int __wrap_lstat(const char *path, struct stat *sb) {
    const int rc = __real_lstat(path, sb);
    testing_swap_now(path);
    return rc;
}

size_t __wrap_fread(void *dst, size_t size, size_t n, FILE *f);
size_t __wrap_fread(void *dst, size_t size, size_t n, FILE *f) {
    if (testing_grow_path && testing_grow_left > 0) {
        testing_grow_left--;
        FILE *g = fopen(testing_grow_path, "ab");
        for (size_t i = 0; g && i < testing_grow_bytes; i++) putc('g', g);
        if (!g || fclose(g) != 0) perror(testing_grow_path);
    }
    return __real_fread(dst, size, n, f);
}

int __wrap_fclose(FILE *f);
int __wrap_fclose(FILE *f) {
    const int flags = fcntl(fileno(f), F_GETFD);
    testing_fclose_count++;
    if (flags < 0 || !(flags & FD_CLOEXEC)) testing_fclose_inheritable++;
    return __real_fclose(f);
}
#endif

#endif
