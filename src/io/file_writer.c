// ag_file_writer: the atomic file replacement of atomic_file.c for files the
// library does not format itself (the example datasets, your own logs).
#include <errno.h>

#include "atomic_file.h"
#include "attograd/io.h"

struct ag_file_writer {
    agi_atomic_file af;
};

int ag_file_path_check(const char *path, ag_err *err) { return agi_atomic_path_check(path, err); }

ag_file_writer *ag_file_writer_open(const char *path, ag_err *err) {
    if (!path) {
        agi_err_set(err, "file_writer_open: path is NULL");
        return NULL;
    }
    ag_file_writer *w = agi_calloc(sizeof *w);
    if (agi_atomic_open(&w->af, path, err)) {
        agi_free(w);
        return NULL;
    }
    return w;
}

void ag_file_writer_write(ag_file_writer *w, const void *data, size_t n) {
    if (w && n && !data && !w->af.write_errno) w->af.write_errno = EFAULT;  // commit reports it
    if (w && n) agi_atomic_write(&w->af, data, n);
}

int ag_file_writer_commit(ag_file_writer *w, ag_err *err) {
    if (!w) {
        agi_err_set(err, "file_writer_commit: the writer is NULL");
        return -1;
    }
    int rc = agi_atomic_commit(&w->af, err);
    agi_free(w);
    return rc;
}

void ag_file_writer_abort(ag_file_writer *w) {
    if (!w) return;
    agi_atomic_abort(&w->af);
    agi_free(w);
}
