#include "path.h"

#include <stdio.h>
#include <string.h>

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
