#define _POSIX_C_SOURCE 200809L  // access
#include "checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist.h"

bool checkpoint_load_checked(ag_params *ps, ag_optim *opt, const char *path, int last_step,
                             ag_safetensors **file, ag_err *err) {
    if (file) *file = NULL;
    ag_safetensors *f;
    if (ag_checkpoint_load(ps, opt ? ag_optim_state(opt) : NULL, path, &f, err) != 0)
        return false;
    const ag_tensor *bad = ag_params_first_nonfinite(ps, false);
    const long long step = opt ? ag_optim_step_count(opt) : 0;
    bool ok = false;
    if (bad)
        snprintf(err->msg, sizeof err->msg, "%.300s: parameter %.100s holds a NaN or an infinity",
                 path, bad->name);
    else if (step < 0 || step > last_step)
        snprintf(err->msg, sizeof err->msg, "%.300s: optimizer.step %lld is outside [0, --steps "
                 "%d]", path, step, last_step);
    else
        ok = true;
    if (ok && file)
        *file = f;
    else
        ag_safetensors_free(f);
    return ok;
}

void checkpoint_save_everywhere(const ag_params *ps, ag_optim *opt, const char *path,
                                const char *const meta[], int status) {
    ag_err err;
    bool saved = true;
    if (dist_rank() == 0)
        saved = ag_checkpoint_save(ps, ag_optim_state(opt), path, meta, &err) == 0;
    dist_check(!saved, status, "%s", err.msg);
}

bool checkpoint_path_usable(const char *flag, const char *path, ag_err *err) {
    char dir[1024];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    if (n >= sizeof dir) {
        snprintf(err->msg, sizeof err->msg, "%s %.200s...: the name is too long", flag, path);
        return false;
    }
    if (!slash) {
        strcpy(dir, ".");
    } else if (n == 0) {
        strcpy(dir, "/");
    } else {
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    struct stat st;
    if (stat(dir, &st) != 0)
        snprintf(err->msg, sizeof err->msg, "%s %.200s: the directory %.200s: %s", flag, path,
                 dir, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        snprintf(err->msg, sizeof err->msg, "%s %.200s: %.200s is not a directory", flag, path,
                 dir);
    else if (access(dir, W_OK | X_OK) != 0)
        snprintf(err->msg, sizeof err->msg, "%s %.200s: cannot write in %.200s: %s", flag, path,
                 dir, strerror(errno));
    else if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        snprintf(err->msg, sizeof err->msg, "%s %.400s: exists and is not a regular file",
                 flag, path);
    else
        return true;
    return false;
}
