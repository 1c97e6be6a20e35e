// Atomic file replacement: temporary file, fsync, rename, fsync the directory.
#define _POSIX_C_SOURCE 200809L

#include "atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Makes temporary names unique between threads of one process; the pid and
// O_EXCL take care of other processes.
static atomic_uint serial;

// A temporary's name is "<base>.tmp.<pid>.<n>", and a name may not exceed 255 bytes on
// Linux's file systems: a target whose own name is near the limit would have no
// temporary, and could not be saved at all. So the base in temporary names is cut to
// leave room for the longest suffix (".tmp.", 10 digits, ".", 10 digits), between
// characters, so that a UTF-8 name stays UTF-8.
#define NAME_LIMIT 255
#define SUFFIX_MAX 26

// The length of `base` (a file name, no '/') in its temporaries' names.
static size_t temporary_base_len(const char *base) {
    size_t n = strlen(base);
    if (n <= NAME_LIMIT - SUFFIX_MAX) return n;
    n = NAME_LIMIT - SUFFIX_MAX;
    // base[n] starts the cut: back to the start of its character (at most 3 bytes back;
    // a name that is not UTF-8 is cut where it is).
    for (int back = 0; back < 3 && ((unsigned char)base[n] & 0xC0) == 0x80; back++) n--;
    return n;
}

// The pid in "<base>.tmp.<pid>.<n>" (digits only, nothing after <n>), with the base
// as temporary_base_len cuts it, or 0 when `name` is not a temporary file of `base`.
static long temporary_pid(const char *name, const char *base) {
    size_t n = temporary_base_len(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0) return 0;
    const char *p = name + n + 5, *dot = strchr(p, '.');
    if (!dot || dot == p || strspn(p, "0123456789") != (size_t)(dot - p) || dot - p > 9) return 0;
    if (!dot[1] || strspn(dot + 1, "0123456789") != strlen(dot + 1)) return 0;
    return strtol(p, NULL, 10);
}

// A save killed between open and commit leaves its temporary file behind,
// and nothing else would ever remove it: a run killed now and then fills the
// disk. So a save removes the temporaries of its own path whose process is
// gone. A live process (kill(pid, 0) succeeds or says EPERM) keeps its file,
// and so does this one (another thread may be saving); a pid reused since
// only delays a removal. Best effort: a failure here is no reason to fail
// the save.
static void remove_stale_temporaries(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    char *dir = agi_malloc(dir_len + 2);
    memcpy(dir, slash ? path : "./", slash ? dir_len : 2);
    dir[slash ? dir_len : 2] = 0;
    DIR *d = *base ? opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long pid = temporary_pid(e->d_name, base);
        if (pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        size_t size = strlen(dir) + strlen(e->d_name) + 1;
        char *stale = agi_malloc(size);
        snprintf(stale, size, "%s%s", dir, e->d_name);
        struct stat sb;
        if (lstat(stale, &sb) == 0 && S_ISREG(sb.st_mode)) (void)unlink(stale);
        agi_free(stale);
    }
    if (d) closedir(d);
    agi_free(dir);
}

// What stands at `path` when it is neither a regular file, a symbolic link nor nothing:
// the rename of a save would put a regular file in its place, so that saving to
// "/dev/null" as root would replace the device. A directory makes the rename fail, but
// only after the whole file was written beside it: refused first, a run is told before
// its work, not after it. (A link is replaced, as io.h says.)
static const char *special_file(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return NULL;
    return S_ISDIR(sb.st_mode)    ? "a directory"
           : S_ISFIFO(sb.st_mode) ? "a FIFO"
           : S_ISCHR(sb.st_mode)  ? "a character device"
           : S_ISBLK(sb.st_mode)  ? "a block device"
           : S_ISSOCK(sb.st_mode) ? "a socket"
                                  : NULL;
}

// Whether the directory a file at path goes in is there and takes files: the temporary
// beside the target is made there.
static bool directory_takes_files(const char *path, ag_err *err) {
    const char *slash = strrchr(path, '/');
    const size_t n = slash && slash != path ? (size_t)(slash - path) : 1;
    char *dir = agi_malloc(n + 1);
    if (slash && slash != path) memcpy(dir, path, n);
    else dir[0] = slash ? '/' : '.';
    dir[n] = '\0';
    struct stat sb;
    bool ok = false;
    char p[AGI_PATH_SHOWN_SIZE], d[AGI_PATH_SHOWN_SIZE];
    const char *ps = agi_path_shown(path, p), *ds = agi_path_shown(dir, d);
    if (stat(dir, &sb) != 0)
        agi_err_set(err, "%s: the directory %s: %s", ps, ds, strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        agi_err_set(err, "%s: %s is not a directory", ps, ds);
    else if (access(dir, W_OK | X_OK) != 0)
        agi_err_set(err, "%s: cannot write in %s: %s", ps, ds, strerror(errno));
    else
        ok = true;
    agi_free(dir);
    return ok;
}

int agi_atomic_path_check(const char *path, ag_err *err) {
    size_t n = path ? strlen(path) : 0;
    const char *special = NULL;
    char p[AGI_PATH_SHOWN_SIZE];
    const char *shown = path ? agi_path_shown(path, p) : NULL;
    if (!path)
        agi_err_set(err, "the path is NULL; name a file to write");
    else if (n == 0)
        agi_err_set(err, "the path is empty; name a file to write");
    else if (path[n - 1] == '/')
        agi_err_set(err, "%s: the path ends in '/'; name a file to write, not a directory",
                    shown);
    else if ((special = special_file(path)))
        agi_err_set(err, "%s: is %s, not a regular file; %s", shown, special,
                    strcmp(special, "a directory") ? "a save would replace it with a file"
                                                   : "name a file to write");
    else if (directory_takes_files(path, err))
        return 0;
    return -1;
}

int agi_atomic_open(agi_atomic_file *af, const char *path, ag_err *err) {
    // Before anything exists: "" would become a temporary "./.tmp.<pid>.<n>", written in
    // full and only then refused by the rename.
    if (agi_atomic_path_check(path, err)) {
        memset(af, 0, sizeof *af);
        af->fd = -1;
        return -1;
    }
    remove_stale_temporaries(path);
    memset(af, 0, sizeof *af);
    af->fd = -1;
    af->path = path;
    size_t size = strlen(path) + 48;
    af->tmp = agi_malloc(size);
    // open(O_EXCL) rather than mkstemp: same safety, and the umask applies
    // (mkstemp would create every checkpoint private, mode 0600).
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    const size_t kept = (size_t)(base - path) + temporary_base_len(base);
    memcpy(af->tmp, path, kept);
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(af->tmp + kept, size - kept, ".tmp.%ld.%u", (long)getpid(),
                 atomic_fetch_add(&serial, 1u));
        af->fd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (af->fd >= 0 || errno != EEXIST) break;
    }
    if (af->fd < 0) {
        char p[AGI_PATH_SHOWN_SIZE], t[AGI_PATH_SHOWN_SIZE];
        agi_err_set(err, "%s: cannot create the temporary file %s: %s", agi_path_shown(path, p),
                    agi_path_shown(af->tmp, t), strerror(errno));
        agi_free(af->tmp);
        af->tmp = NULL;
        return -1;
    }
    // A file that is replaced keeps its permissions: a private checkpoint
    // stays private. Best effort: not owning the old file is no reason to fail.
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) (void)fchmod(af->fd, sb.st_mode & 07777);
    return 0;
}

void agi_atomic_write(agi_atomic_file *af, const void *data, size_t n) {
    const char *p = data;
    while (n > 0 && !af->write_errno) {
        ssize_t w = write(af->fd, p, n < (1u << 30) ? n : (1u << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            af->write_errno = w < 0 ? errno : EIO;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
}

void agi_atomic_abort(agi_atomic_file *af) {
    if (af->fd >= 0) close(af->fd);
    if (af->tmp) unlink(af->tmp);
    agi_free(af->tmp);
    af->fd = -1;
    af->tmp = NULL;
}

// The directory entry changed by the rename is durable only once the
// directory itself is synced.
static int sync_directory(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t n = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
    char *dir = agi_malloc(n + 1);
    memcpy(dir, !slash ? "." : slash == path ? "/" : path, n);
    dir[n] = 0;
    int rc = 0, fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = errno;
    } else {
        if (fsync(fd) != 0) rc = errno;
        close(fd);
    }
    agi_free(dir);
    return rc == EINVAL ? 0 : rc;  // some file systems cannot sync a directory
}

int agi_atomic_commit(agi_atomic_file *af, ag_err *err) {
    const char *failed = NULL;
    int e = af->write_errno;
    if (e)
        failed = "writing";
    else if (fsync(af->fd) != 0)
        failed = "flushing (fsync)", e = errno;
    int closed = close(af->fd);
    af->fd = -1;
    if (!failed && closed != 0) failed = "closing", e = errno;
    if (!failed && rename(af->tmp, af->path) != 0) failed = "renaming", e = errno;
    if (failed) {
        char p[AGI_PATH_SHOWN_SIZE], t[AGI_PATH_SHOWN_SIZE];
        agi_err_set(err, "%s: %s %s failed: %s; the file was left as it was",
                    agi_path_shown(af->path, p), failed, agi_path_shown(af->tmp, t), strerror(e));
        agi_atomic_abort(af);
        return -1;
    }
    agi_free(af->tmp);
    af->tmp = NULL;
    e = sync_directory(af->path);
    if (e) {
        char p[AGI_PATH_SHOWN_SIZE];
        agi_err_set(err, "%s: saved, but syncing its directory failed: %s",
                    agi_path_shown(af->path, p), strerror(e));
        return -1;
    }
    return 0;
}
