// The committed datasets, datasets/<task>/{train,valid,test}.txt: which task,
// size, count, seed and stream each file comes from. Changing a row here (or
// the generator in task.c) changes the files; test_data checks that the
// committed files are exactly what this table produces.
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "seqdata_internal.h"

enum { N_TASKS = 3, N_SPLITS = 3 };

static const char *const split_names[N_SPLITS] = {"train", "valid", "test"};

// Every file has its own pcg32 stream (1 to 9) of one seed, so no two splits
// share generator state. Recall scores one token per sequence (copy and
// reverse score 16), so its training split is larger.
static const struct {
    ag_task task;
    int length;
    int count[N_SPLITS];
    uint64_t stream[N_SPLITS];
} standard[N_TASKS] = {
    {AG_TASK_COPY, 16, {4096, 512, 1024}, {1, 2, 3}},
    {AG_TASK_REVERSE, 16, {4096, 512, 1024}, {4, 5, 6}},
    {AG_TASK_RECALL, 8, {8192, 512, 1024}, {7, 8, 9}},
};
static const uint64_t standard_seed = 1;

static int make_dir(const char *path, ag_err *err) {
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
    return seq_fail(err, path, 0, "cannot create directory: %s", strerror(errno));
}

int ag_seqdata_make_standard(const char *dir, ag_err *err) {
    if (!dir) {
        return seq_fail(err, NULL, 0, "directory is NULL");
    }
    ag_seqdata *data[N_TASKS][N_SPLITS] = {{NULL}};
    int rc = 0;
    // Generate everything and check it before writing anything.
    for (int t = 0; t < N_TASKS; t++)
        for (int s = 0; s < N_SPLITS; s++)
            data[t][s] =
                ag_seqdata_generate(standard[t].task, standard[t].length, standard[t].count[s],
                                    standard_seed, standard[t].stream[s]);
    for (int t = 0; t < N_TASKS && rc == 0; t++) {
        for (int a = 0; a < N_SPLITS && rc == 0; a++) {
            for (int b = a + 1; b < N_SPLITS && rc == 0; b++) {
                int shared = ag_seqdata_count_shared(data[t][a], data[t][b]);
                if (shared) {
                    rc = seq_fail(err, dir, 0,
                                      "%d sequences of %s/%s also occur in %s/%s; nothing written",
                                      shared, ag_task_name(standard[t].task), split_names[b],
                                      ag_task_name(standard[t].task), split_names[a]);
                }
            }
        }
    }
    char path[4096];
    if (rc == 0) rc = make_dir(dir, err);
    for (int t = 0; t < N_TASKS && rc == 0; t++) {
        snprintf(path, sizeof path, "%s/%s", dir, ag_task_name(standard[t].task));
        rc = make_dir(path, err);
        for (int s = 0; s < N_SPLITS && rc == 0; s++) {
            snprintf(path, sizeof path, "%s/%s/%s.txt", dir, ag_task_name(standard[t].task),
                     split_names[s]);
            rc = ag_seqdata_save(data[t][s], path, err);
        }
    }
    for (int t = 0; t < N_TASKS; t++)
        for (int s = 0; s < N_SPLITS; s++) ag_seqdata_free(data[t][s]);
    return rc;
}
