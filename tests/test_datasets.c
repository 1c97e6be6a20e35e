// The committed datasets under datasets/: they are exactly what
// ag_seqdata_make_standard writes (regenerated here in-process, compared byte
// for byte), they load with the sizes datasets/README.md documents, and no
// sequence of one split occurs in another split of the same task.
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include "seqdata.h"
#include "testing.h"

static const char *const tasks[3] = {"copy", "reverse", "recall"};
static const char *const splits[3] = {"train", "valid", "test"};

static char *read_bytes(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 18, len = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    *n = len;
    return buf;
}

static void committed_path(char *buf, size_t size, int t, int s) {
    snprintf(buf, size, "%s/datasets/%s/%s.txt", AG_SOURCE_DIR, tasks[t], splits[s]);
}

static void test_committed_files_regenerate_byte_for_byte(void) {
    char dir[64] = "test_datasets_XXXXXX", fresh[512], committed[512];
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp failed");
        return;
    }
    ag_err err = {{0}};
    int rc = ag_seqdata_make_standard(dir, &err);
    CHECK(rc == 0);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    for (int t = 0; t < 3; t++) {
        for (int s = 0; s < 3; s++) {
            snprintf(fresh, sizeof fresh, "%s/%s/%s.txt", dir, tasks[t], splits[s]);
            committed_path(committed, sizeof committed, t, s);
            size_t n1, n2;
            char *a = read_bytes(fresh, &n1), *b = read_bytes(committed, &n2);
            bool same = a && b && n1 == n2 && memcmp(a, b, n1) == 0;
            if (!same)
                fprintf(stderr, "  %s differs from the regenerated file (%zu vs %zu bytes)\n",
                        committed, n2, n1);
            CHECK(same);
            free(a);
            free(b);
            remove(fresh);
        }
        snprintf(fresh, sizeof fresh, "%s/%s", dir, tasks[t]);
        rmdir(fresh);
    }
    rmdir(dir);
}

// No stale or stray files: each task directory holds exactly the three splits.
static void test_task_directories_hold_exactly_the_three_splits(void) {
    for (int t = 0; t < 3; t++) {
        char path[512];
        snprintf(path, sizeof path, "%s/datasets/%s", AG_SOURCE_DIR, tasks[t]);
        DIR *dir = opendir(path);
        CHECK(dir != NULL);
        if (!dir) continue;
        int found = 0, stray = 0;
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            bool known = false;
            for (int s = 0; s < 3; s++) {
                char name[32];
                snprintf(name, sizeof name, "%s.txt", splits[s]);
                known |= strcmp(e->d_name, name) == 0;
            }
            if (!known) fprintf(stderr, "  stray file %s/%s\n", path, e->d_name);
            found += known;
            stray += !known;
        }
        closedir(dir);
        CHECK(found == 3 && stray == 0);
    }
}

static void test_committed_files_load_with_the_documented_sizes(void) {
    const int length[3] = {16, 16, 8}, seq_len[3] = {33, 33, 19};
    const int count[3][3] = {{4096, 512, 1024}, {4096, 512, 1024}, {8192, 512, 1024}};
    uint64_t streams_seen = 0;
    for (int t = 0; t < 3; t++) {
        for (int s = 0; s < 3; s++) {
            char path[512];
            committed_path(path, sizeof path, t, s);
            ag_err err = {{0}};
            ag_seqdata *d = ag_seqdata_load(path, &err);
            CHECK(d != NULL);
            if (!d) {
                fprintf(stderr, "  %s\n", err.msg);
                continue;
            }
            CHECK(strcmp(ag_task_name(d->task), tasks[t]) == 0);
            CHECK(d->length == length[t] && d->seq_len == seq_len[t] && d->count == count[t][s]);
            CHECK(d->has_seed && d->seed == 1 && d->stream >= 1 && d->stream <= 9);
            if (d->stream < 64) streams_seen |= 1ull << d->stream;
            ag_seqdata_free(d);
        }
    }
    CHECK(streams_seen == 0x3feull);  // streams 1 to 9, each used once: no shared generator
}

static void test_no_sequence_occurs_in_two_splits(void) {
    for (int t = 0; t < 3; t++) {
        ag_seqdata *d[3] = {NULL, NULL, NULL};
        for (int s = 0; s < 3; s++) {
            char path[512];
            committed_path(path, sizeof path, t, s);
            ag_err err;
            d[s] = ag_seqdata_load(path, &err);
        }
        CHECK(d[0] && d[1] && d[2]);
        if (d[0] && d[1] && d[2]) {
            CHECK(ag_seqdata_count_shared(d[0], d[2]) == 0);  // test in train
            CHECK(ag_seqdata_count_shared(d[0], d[1]) == 0);  // valid in train
            CHECK(ag_seqdata_count_shared(d[1], d[2]) == 0);  // test in valid
        }
        for (int s = 0; s < 3; s++) ag_seqdata_free(d[s]);
    }
}

static void test_make_standard_reports_an_unusable_directory(void) {
    const char *file = "test_datasets_not_a_dir";
    FILE *f = fopen(file, "wb");
    CHECK(f != NULL);
    if (f) fclose(f);
    ag_err err = {{0}};
    CHECK(ag_seqdata_make_standard(file, &err) != 0);
    CHECK(strcmp(err.msg,
                 "test_datasets_not_a_dir/copy: cannot create directory: Not a directory") == 0);
    CHECK(ag_seqdata_make_standard(NULL, &err) != 0);
    remove(file);
}

int main(void) {
    RUN(test_committed_files_regenerate_byte_for_byte);
    RUN(test_task_directories_hold_exactly_the_three_splits);
    RUN(test_committed_files_load_with_the_documented_sizes);
    RUN(test_no_sequence_occurs_in_two_splits);
    RUN(test_make_standard_reports_an_unusable_directory);
    return testing_summary();
}
