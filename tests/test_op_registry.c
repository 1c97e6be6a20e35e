// The op registry (src/ops/registry.h) is the one list of ops: an op defined in src/ops/,
// declared in include/attograd/ops.h or shown in the README's op table is in it, and each
// op of it is in all three, with one name and one rule for its f32 and f64 variants.
#define _POSIX_C_SOURCE 200809L  // opendir: the test lists the op files
#include <ctype.h>

#include "../src/ops/registry.h"
#include "testing.h"
#include "testing_files.h"

// The text of a file of the repository (malloc'd), or NULL after a failed CHECK.
static char *source(const char *relative) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", AG_SOURCE_DIR, relative);
    size_t size;
    char *text = (char *)testing_read_file(path, &size);
    if (!text) fprintf(stderr, "  cannot read %s\n", path);
    CHECK(text != NULL);
    return text;
}

// The names that follow `key` in text, up to the first character that cannot be in a C
// name, one per occurrence, into names[*n ...]; `end` (or NULL) stops the search.
static void names_after(const char *text, const char *end, const char *key, char names[][32],
                        int *n, int max) {
    for (const char *s = text; (s = strstr(s, key)) != NULL && (!end || s < end); s++) {
        const char *name = s + strlen(key);
        size_t k = 0;
        while (isalnum((unsigned char)name[k]) || name[k] == '_') k++;
        if (k > 0 && k < 32 && *n < max) snprintf(names[(*n)++], 32, "%.*s", (int)k, name);
    }
}

static bool listed(char names[][32], int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return true;
    return false;
}

// Every name found is an op of the registry, and every op of the registry is found.
static void same_ops(char names[][32], int n, const char *where) {
    for (int i = 0; i < n; i++) {
        if (!agi_op_find(names[i])) {
            fprintf(stderr, "  %s has ag_%s, which is not in src/ops/registry.h\n", where,
                    names[i]);
            CHECK(!"every op is in the registry");
        }
    }
    for (int i = 0; i < agi_n_ops; i++) {
        if (!listed(names, n, agi_ops[i].name)) {
            fprintf(stderr, "  ag_%s (src/ops/registry.h) is missing from %s\n",
                    agi_ops[i].name, where);
            CHECK(!"every op of the registry is everywhere");
        }
    }
}

static void test_each_op_is_in_the_registry_once(void) {
    CHECK(agi_n_ops >= 54);
    for (int i = 0; i < agi_n_ops; i++) CHECK(agi_op_find(agi_ops[i].name) == &agi_ops[i]);
    CHECK(agi_op_find("no_such_op") == NULL);
    CHECK(agi_op_find(NULL) == NULL);
}

// The registry's name is the name of both variants, which share one rule, and the f64
// twin of the f32 variant (what ag_tape_check runs) is the f64 variant.
static void test_each_op_has_one_name_and_one_rule_in_both_dtypes(void) {
    for (int i = 0; i < agi_n_ops; i++) {
        const agi_op_entry *e = &agi_ops[i];
        bool ok = e->f32 != e->f64 && strcmp(e->f32->name, e->name) == 0 &&
                  strcmp(e->f64->name, e->name) == 0 && e->f32->forward && e->f64->forward &&
                  e->f32->backward && e->f64->backward && e->f32->rule && e->f64->rule &&
                  strcmp(e->f32->rule, e->f64->rule) == 0 && e->torch && e->torch[0] &&
                  agi_op_f64(e->f32) == e->f64 && agi_op_f64(e->f64) == NULL;
        if (!ok) fprintf(stderr, "  registry entry %s disagrees with its ag_ops\n", e->name);
        CHECK(ok);
    }
}

// Every `const ag_op R(agi_<x>_op)` of src/ops/*.c is an op of the registry. (The reverse
// is the linker's: the registry's table refers to both variants of each of its ops.)
static void test_every_op_defined_in_src_ops_is_in_the_registry(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/src/ops", AG_SOURCE_DIR);
    DIR *dir = opendir(path);
    CHECK(dir != NULL);
    int defined = 0;
    for (struct dirent *d; dir && (d = readdir(dir)) != NULL;) {
        size_t len = strlen(d->d_name);
        if (len < 3 || strcmp(d->d_name + len - 2, ".c") != 0) continue;
        char file[600];
        snprintf(file, sizeof file, "src/ops/%s", d->d_name);
        char *text = source(file);
        char names[64][32];
        int n = 0;
        names_after(text, NULL, "const ag_op R(agi_", names, &n, 64);
        for (int i = 0; i < n; i++) {
            size_t k = strlen(names[i]);
            if (k > 3 && strcmp(names[i] + k - 3, "_op") == 0) names[i][k - 3] = 0;
            defined++;
            if (!agi_op_find(names[i])) {
                fprintf(stderr, "  %s defines agi_%s_op, which is not in src/ops/registry.h\n",
                        file, names[i]);
                CHECK(!"every op defined in src/ops/ is in the registry");
            }
        }
        free(text);
    }
    if (dir) closedir(dir);
    CHECK(defined == agi_n_ops);
}

// include/attograd/ops.h declares `ag_tensor *ag_<op>(ag_tape *tp, ...)` for exactly the
// ops of the registry.
static void test_ops_h_declares_exactly_the_ops_of_the_registry(void) {
    char *text = source("include/attograd/ops.h");
    if (!text) return;
    char names[256][32];
    int n = 0;
    names_after(text, NULL, "ag_tensor *ag_", names, &n, 256);
    same_ops(names, n, "include/attograd/ops.h");
    free(text);
}

// The README's op table (the rows of its section "## The ops") shows exactly the ops of the
// registry.
static void test_readme_op_table_shows_exactly_the_ops_of_the_registry(void) {
    char *text = source("README.md");
    if (!text) return;
    char *begin = strstr(text, "\n## The ops\n");
    CHECK(begin != NULL);
    if (!begin) {
        free(text);
        return;
    }
    char *end = strstr(begin + 1, "\n## ");
    char names[256][32];
    int n = 0;
    for (char *row = strstr(begin, "\n|"); row && (!end || row < end);
         row = strstr(row + 1, "\n|")) {
        char *eol = strchr(row + 1, '\n');
        names_after(row, eol, "`ag_", names, &n, 256);
    }
    same_ops(names, n, "the README's op table");
    free(text);
}

int main(void) {
    RUN(test_each_op_is_in_the_registry_once);
    RUN(test_each_op_has_one_name_and_one_rule_in_both_dtypes);
    RUN(test_every_op_defined_in_src_ops_is_in_the_registry);
    RUN(test_ops_h_declares_exactly_the_ops_of_the_registry);
    RUN(test_readme_op_table_shows_exactly_the_ops_of_the_registry);
    return testing_summary();
}
