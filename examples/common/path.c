#define _XOPEN_SOURCE 700  // realpath
#include "path.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

bool path_beside(char *out, size_t size, const char *path, const char *ext, const char *suffix) {
    size_t len = strlen(path);
    const size_t e = strlen(ext);
    if (len > e && strcmp(path + len - e, ext) == 0) len -= e;
    const int n = snprintf(out, size, "%.*s%s", (int)len, path, suffix);
    if (n < 0 || (size_t)n >= size) {
        if (size) out[0] = '\0';
        return false;
    }
    return true;
}

// path with its directory resolved (".", links and ".." gone), into out: what a file not
// yet written will be. The path as given when its directory cannot be resolved.
static void resolved(const char *path, char *out, size_t size) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    const char *base = slash ? slash + 1 : path;
    const int n = slash ? snprintf(dir, sizeof dir, "%.*s", (int)(slash - path + 1), path)
                        : snprintf(dir, sizeof dir, ".");
    char *full = n > 0 && (size_t)n < sizeof dir ? realpath(dir, NULL) : NULL;
    if (!full || snprintf(out, size, "%s/%s", full, base) >= (int)size)
        snprintf(out, size, "%s", path);
    free(full);
}

static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char ra[PATH_MAX + 1], rb[PATH_MAX + 1];
    resolved(a, ra, sizeof ra);
    resolved(b, rb, sizeof rb);
    return strcmp(ra, rb) == 0;
}

bool run_files_distinct(const run_file *files, int n, ag_err *err) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const run_file *w = &files[i], *o = &files[j];
            if (i == j || !w->writes || !w->path || !o->path || (o->writes && j < i)) continue;
            const bool allowed = (w->may_be && strcmp(w->may_be, o->flag) == 0) ||
                                 (o->may_be && strcmp(o->may_be, w->flag) == 0);
            if (allowed || !same_file(w->path, o->path)) continue;
            snprintf(err->msg, sizeof err->msg, "%.20s %.200s is the file %.20s %s "
                     "(%.200s): give them different files", w->flag, w->path, o->flag,
                     o->writes ? "writes too" : "reads", o->path);
            return false;
        }
    return true;
}

bool run_files_outside(const run_file *files, int n, const char *dir_flag, const char *dir,
                       ag_err *err) {
    struct stat d;
    if (!dir || stat(dir, &d) != 0 || !S_ISDIR(d.st_mode)) return true;
    for (int i = 0; i < n; i++) {
        const char *path = files[i].path;
        if (!files[i].writes || !path) continue;
        const char *slash = strrchr(path, '/');
        char parent[PATH_MAX];
        const int len = slash ? snprintf(parent, sizeof parent, "%.*s", (int)(slash - path + 1),
                                         path)
                              : snprintf(parent, sizeof parent, ".");
        struct stat p;
        if (len <= 0 || (size_t)len >= sizeof parent || stat(parent, &p) != 0 ||
            p.st_dev != d.st_dev || p.st_ino != d.st_ino)
            continue;
        snprintf(err->msg, sizeof err->msg, "%.20s %.150s goes in %.20s's directory (%.150s), "
                 "every file of which is read: write it elsewhere", files[i].flag, path,
                 dir_flag, dir);
        return false;
    }
    return true;
}
