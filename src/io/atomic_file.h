// Replacing a file atomically: readers (and a reboot) see the old contents or
// the new, never a mix. The bytes go to a temporary file beside the target
// (same directory, so the same file system), are flushed to disk, and then
// renamed over the target; the directory is then synced so the rename
// itself survives a crash.
//
//     agi_atomic_file af;
//     if (agi_atomic_open(&af, path, err)) return -1;
//     agi_atomic_write(&af, bytes, n);      // as often as needed
//     return agi_atomic_commit(&af, err);   // or agi_atomic_abort(&af)
#ifndef ATTOGRAD_IO_ATOMIC_FILE_H
#define ATTOGRAD_IO_ATOMIC_FILE_H

#include "../core/internal.h"

typedef struct agi_atomic_file {
    const char *path;
    char *tmp;         // "<path>.tmp.<pid>.<n>", a long file name cut (atomic_file.c)
    int fd;
    int write_errno;   // of the first failed write; later writes are skipped
} agi_atomic_file;

// 0 when `path` can name a file to write; -1 with one line in err when it is NULL,
// empty, ends in '/', or names a directory, a FIFO, a device or a socket (what
// ag_file_path_check reports).
int agi_atomic_path_check(const char *path, ag_err *err);
// Checks the path (agi_atomic_path_check), then creates the temporary file (with the
// target's permissions when the target exists, else the usual 0666 less the umask).
// First removes the temporary files of `path` whose writing process is gone (saves
// that were killed).
int agi_atomic_open(agi_atomic_file *af, const char *path, ag_err *err);
void agi_atomic_write(agi_atomic_file *af, const void *data, size_t n);
// fsync, close, rename over the target, fsync the directory. On failure the
// temporary file is removed and the target is as it was before.
int agi_atomic_commit(agi_atomic_file *af, ag_err *err);
// Gives up: removes the temporary file.
void agi_atomic_abort(agi_atomic_file *af);

#endif
