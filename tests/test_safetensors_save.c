// Saving is atomic: a failed save, or a process killed in the middle of one,
// leaves the previous file exactly as it was, and a failed save leaves no
// temporary file behind. Failures are provoked for real: a file-size limit
// (RLIMIT_FSIZE) makes writes fail, or kills a child process mid-write.
#define _POSIX_C_SOURCE 200809L

#include "attograd/io.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "testing.h"
#include "testing_files.h"

// A set of one f32 tensor of `n` values, all equal to `v`.
static ag_safetensors *filled_set(int n, float v) {
    ag_safetensors *st = ag_safetensors_new();
    ag_tensor *t = ag_tensor_zeros(AG_F32, 1, (int[]){n});
    ag_tensor_fill(t, v);
    ag_err err;
    CHECK(ag_safetensors_add(st, "w", t, &err) == 0);
    ag_tensor_free(t);
    return st;
}

static bool saves(const ag_safetensors *st, const char *path) {
    ag_err err;
    if (ag_safetensors_save(st, path, &err) == 0) return true;
    fprintf(stderr, "  save failed: %s\n", err.msg);
    return false;
}

static bool file_equals(const char *path, const unsigned char *bytes, size_t n) {
    size_t m;
    unsigned char *now = testing_read_file(path, &m);
    bool same = now && m == n && memcmp(now, bytes, n) == 0;
    free(now);
    return same;
}

// Value 0 of tensor "w" in the file at `path`, or NAN if it does not load.
static double first_value(const char *path) {
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    double v = st && ag_safetensors_find(st, "w") ? ag_tensor_item(ag_safetensors_find(st, "w"), 0)
                                                 : NAN;
    ag_safetensors_free(st);
    return v;
}

static void test_save_replaces_an_existing_file(void) {
    const char *path = testing_path("replace.safetensors");
    ag_safetensors *a = filled_set(16, 1.0f), *b = filled_set(32, 2.0f);
    CHECK(saves(a, path));
    CHECK(first_value(path) == 1.0);
    CHECK(saves(b, path));
    CHECK(first_value(path) == 2.0);
    CHECK(testing_count_files(".tmp.") == 0);
    ag_safetensors_free(a);
    ag_safetensors_free(b);
}

static void test_save_into_a_missing_directory_fails_cleanly(void) {
    const char *path = testing_path("no/such/dir/model.safetensors");
    ag_safetensors *st = filled_set(4, 1.0f);
    ag_err err;
    CHECK(ag_safetensors_save(st, path, &err) != 0);
    CHECK(strstr(err.msg, path) == err.msg);
    CHECK(strstr(err.msg, ": the directory ") != NULL);  // named before anything is made
    CHECK(strstr(err.msg, "No such file or directory") != NULL);
    ag_safetensors_free(st);
}

static void test_failed_write_keeps_the_previous_file_and_no_temporary(void) {
    const char *path = testing_path("full_disk.safetensors");
    ag_safetensors *old = filled_set(16, 1.0f), *big = filled_set(1 << 14, 2.0f);
    CHECK(saves(old, path));
    size_t n;
    unsigned char *before = testing_read_file(path, &n);

    testing_file_size limit = testing_file_size_limit(4096);
    ag_err err;
    int rc = ag_safetensors_save(big, path, &err);
    testing_file_size_restore(limit);

    CHECK(rc != 0);
    CHECK(strstr(err.msg, path) == err.msg);
    CHECK(strstr(err.msg, "writing") && strstr(err.msg, "File too large"));
    CHECK(strstr(err.msg, "was left as it was") != NULL);
    CHECK(file_equals(path, before, n));
    CHECK(testing_count_files(".tmp.") == 0);
    free(before);
    ag_safetensors_free(old);
    ag_safetensors_free(big);
}

static void test_failed_rename_keeps_the_target_and_no_temporary(void) {
    // A directory appears at the target while the file is written (a directory there at
    // the start is refused before anything is written): the rename fails.
    char path[640];
    snprintf(path, sizeof path, "%s", testing_path("a_directory"));
    ag_err err;
    ag_file_writer *w = ag_file_writer_open(path, &err);
    CHECK(w != NULL);
    ag_file_writer_write(w, "text", 4);
    CHECK(mkdir(path, 0700) == 0);
    CHECK(ag_file_writer_commit(w, &err) != 0);
    CHECK(strstr(err.msg, "renaming") && strstr(err.msg, "Is a directory"));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
    CHECK(testing_count_files(".tmp.") == 0);
    rmdir(path);
}

static void test_crash_mid_save_keeps_the_previous_file(void) {
    const char *path = testing_path("crash.safetensors");
    ag_safetensors *old = filled_set(16, 1.0f), *big = filled_set(1 << 16, 2.0f);
    CHECK(saves(old, path));
    size_t n;
    unsigned char *before = testing_read_file(path, &n);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        // The default action of SIGXFSZ kills the process at the first write
        // past the limit: a crash in the middle of the data. No core file.
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        testing_file_size_limit(8192);
        signal(SIGXFSZ, SIG_DFL);
        ag_err err;
        ag_safetensors_save(big, path, &err);
        _exit(0);  // not reached if the limit did its job
    }
    int status = 0;
    CHECK(child > 0 && waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ);
    CHECK(file_equals(path, before, n));
    CHECK(first_value(path) == 1.0);
    // The killed save could not clean up: its partial temporary file is the
    // only trace, and it is not the checkpoint.
    CHECK(testing_count_files(".tmp.") == 1);
    testing_remove_files(".tmp.");
    free(before);
    ag_safetensors_free(old);
    ag_safetensors_free(big);
}

static void test_replaced_file_keeps_its_permissions(void) {
    const char *path = testing_path("private.safetensors");
    ag_safetensors *st = filled_set(4, 1.0f);
    CHECK(saves(st, path));
    CHECK(chmod(path, 0600) == 0);
    CHECK(saves(st, path));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600);

    mode_t old_mask = umask(022);
    const char *fresh = testing_path("fresh.safetensors");
    CHECK(saves(st, fresh));
    CHECK(stat(fresh, &sb) == 0 && (sb.st_mode & 0777) == 0644);  // not mkstemp's 0600
    umask(old_mask);
    ag_safetensors_free(st);
}

typedef struct saver {
    const char *path;
    float value;
    int failures;
} saver;

static void *save_repeatedly(void *arg) {
    saver *s = arg;
    ag_safetensors *st = filled_set(1000, s->value);
    for (int i = 0; i < 10; i++) {
        ag_err err;
        s->failures += ag_safetensors_save(st, s->path, &err) != 0;
    }
    ag_safetensors_free(st);
    return NULL;
}

static void test_concurrent_saves_leave_one_complete_file(void) {
    const char *path = testing_path("contended.safetensors");
    pthread_t threads[4];
    saver savers[4];
    for (int i = 0; i < 4; i++) {
        savers[i] = (saver){path, (float)(i + 1), 0};
        pthread_create(&threads[i], NULL, save_repeatedly, &savers[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(threads[i], NULL);
        CHECK(savers[i].failures == 0);
    }
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    const ag_tensor *w = st ? ag_safetensors_find(st, "w") : NULL;
    CHECK(w && w->numel == 1000);
    double v = w ? ag_tensor_item(w, 0) : 0;
    CHECK(v == 1 || v == 2 || v == 3 || v == 4);
    for (size_t i = 0; w && i < w->numel; i++) CHECK(ag_tensor_item(w, i) == v);  // not a mix
    CHECK(testing_count_files(".tmp.") == 0);
    ag_safetensors_free(st);
}

// A path that cannot name a file ("", one ending in '/', or an existing directory) is
// refused before a temporary file exists, so a program that checks it first refuses
// before computing what it would save (a directory was found out only by the rename,
// after the whole file was written). The empty path is tried in the scratch directory,
// where a temporary would land.
static void test_empty_or_directory_path_is_refused_before_any_file_is_made(void) {
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(testing_tmpdir()) == 0);
    ag_err err;
    char dir[640], existing[640];
    snprintf(dir, sizeof dir, "%s", testing_path("out/"));
    snprintf(existing, sizeof existing, "%s", testing_path("a_dir"));
    CHECK(mkdir(existing, 0700) == 0);
    const char *bad[] = {"", dir, existing};
    const char *why[] = {"the path is empty; name a file to write",
                         "the path ends in '/'; name a file to write, not a directory",
                         "is a directory, not a regular file; name a file to write"};
    for (int i = 0; i < 3; i++) {
        CHECK(ag_file_path_check(bad[i], &err) != 0);
        CHECK(strstr(err.msg, why[i]) != NULL);
        ag_file_writer *w = ag_file_writer_open(bad[i], &err);
        CHECK(w == NULL);
        ag_file_writer_abort(w);
        CHECK(strstr(err.msg, bad[i]) == err.msg && strstr(err.msg, why[i]) != NULL);
        ag_safetensors *st = filled_set(4, 1.0f);
        CHECK(ag_safetensors_save(st, bad[i], &err) != 0 && strstr(err.msg, why[i]) != NULL);
        ag_safetensors_free(st);
    }
    CHECK(strcmp(err.msg, "") != 0 && strchr(err.msg, '\n') == NULL);
    CHECK(testing_count_files(".tmp.") == 0);
    CHECK(ag_file_path_check(testing_path("model.safetensors"), &err) == 0);
    CHECK(ag_file_path_check(NULL, &err) != 0 && strstr(err.msg, "NULL") != NULL);
    struct stat sb;
    CHECK(stat(existing, &sb) == 0 && S_ISDIR(sb.st_mode));
    rmdir(existing);
    CHECK(chdir(cwd) == 0);
}

// A path whose directory is missing, or is a file, is refused by ag_file_path_check too,
// naming the directory: a program that asked first (attograd-mha, the examples) had to
// check the directory itself, or computed everything and then failed to make the
// temporary. A save there says the same before it creates anything.
static void test_a_path_in_no_directory_is_refused_naming_it(void) {
    char missing[640], under_file[700], file[640];
    snprintf(missing, sizeof missing, "%s", testing_path("no/such/dir/m.safetensors"));
    snprintf(file, sizeof file, "%s", testing_path("plain"));
    snprintf(under_file, sizeof under_file, "%s/m.safetensors", file);
    testing_write_file(file, "x", 1);
    char want[2][1600];
    snprintf(want[0], sizeof want[0], "%s: the directory %s: No such file or directory",
             missing, testing_path("no/such/dir"));
    snprintf(want[1], sizeof want[1], "%s: %s is not a directory", under_file, file);
    const char *paths[2] = {missing, under_file};
    for (int i = 0; i < 2; i++) {
        ag_err err;
        CHECK(ag_file_path_check(paths[i], &err) != 0 && strcmp(err.msg, want[i]) == 0);
        ag_safetensors *st = filled_set(4, 1.0f);
        CHECK(ag_safetensors_save(st, paths[i], &err) != 0 && strcmp(err.msg, want[i]) == 0);
        ag_safetensors_free(st);
    }
    CHECK(ag_file_path_check("m.safetensors", &(ag_err){{0}}) == 0);  // ".": here
    CHECK(testing_count_files(".tmp.") == 0);
    remove(file);
}

// A FIFO (as a device or a socket) at the path is not a file to replace: the rename of a
// save would put a regular file in its place, as it would put one over /dev/null for a
// save run as root. The save is refused before a temporary exists, and the FIFO stays.
static void test_a_fifo_at_the_path_is_refused_and_left_in_place(void) {
    const char *path = testing_path("a_fifo");
    CHECK(mkfifo(path, 0600) == 0);
    ag_safetensors *st = filled_set(4, 1.0f);
    ag_err err;
    CHECK(ag_safetensors_save(st, path, &err) != 0);
    CHECK(strstr(err.msg, path) == err.msg &&
          strstr(err.msg, "is a FIFO, not a regular file; a save would replace it") != NULL);
    struct stat sb;
    CHECK(lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode));
    CHECK(testing_count_files(".tmp.") == 0);
    unlink(path);
    ag_safetensors_free(st);
}

// A path longer than the message filled it and the problem was cut off: a save into a
// missing directory 4 KiB deep said only the path. Past 200 bytes a path is shown as its
// first 80 bytes, "...", and its last 100, and the problem follows.
static void test_a_long_path_leaves_room_for_the_problem(void) {
    static char path[4200];
    int n = snprintf(path, sizeof path, "%s", testing_path("missing"));
    while (n < 4100) n += snprintf(path + n, sizeof path - (size_t)n, "/d");
    snprintf(path + n, sizeof path - (size_t)n, "/model.safetensors");
    ag_safetensors *st = filled_set(3, 1.0f);
    ag_err err = {{0}};
    CHECK(ag_safetensors_save(st, path, &err) != 0);
    const size_t len = strlen(path), dir_len = len - strlen("/model.safetensors");
    char want[512];
    snprintf(want, sizeof want, "%.80s...%.100s: the directory %.80s...%.100s: %s", path,
             path + len - 100, path, path + dir_len - 100, strerror(ENAMETOOLONG));
    CHECK(strcmp(err.msg, want) == 0);
    // A shorter one, whose directory is merely missing: both shown, and the reason.
    path[700] = 0;
    if (path[699] == '/') path[699] = 0;
    const size_t cut = strlen(path), cut_dir = (size_t)(strrchr(path, '/') - path);
    CHECK(ag_safetensors_save(st, path, &err) != 0);
    snprintf(want, sizeof want, "%.80s...%.100s: the directory %.80s...%.100s: %s", path,
             path + cut - 100, path, path + cut_dir - 100, strerror(ENOENT));
    CHECK(strcmp(err.msg, want) == 0);
    ag_safetensors_free(st);
}

int main(void) {
    RUN(test_save_replaces_an_existing_file);
    RUN(test_save_into_a_missing_directory_fails_cleanly);
    RUN(test_failed_write_keeps_the_previous_file_and_no_temporary);
    RUN(test_failed_rename_keeps_the_target_and_no_temporary);
    RUN(test_crash_mid_save_keeps_the_previous_file);
    RUN(test_replaced_file_keeps_its_permissions);
    RUN(test_concurrent_saves_leave_one_complete_file);
    RUN(test_empty_or_directory_path_is_refused_before_any_file_is_made);
    RUN(test_a_path_in_no_directory_is_refused_naming_it);
    RUN(test_a_fifo_at_the_path_is_refused_and_left_in_place);
    RUN(test_a_long_path_leaves_room_for_the_problem);
    testing_remove_tmpdir();
    return testing_summary();
}
