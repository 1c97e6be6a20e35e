// A save killed between writing its temporary file and renaming it leaves
// "<path>.tmp.<pid>.<n>" behind (issue 9: 179 files, 365 MB after 300 kills).
// The next save to the same path removes those whose process is gone, and
// nothing else: not a live process's, not this process's, not another
// path's, not a name that only looks similar.
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <sys/wait.h>

#include "attograd/io.h"
#include "testing.h"
#include "testing_files.h"

static bool exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

// A pid whose process has exited and been reaped.
static long dead_pid(void) {
    pid_t child = fork();
    if (child == 0) _exit(0);
    int status;
    waitpid(child, &status, 0);
    return (long)child;
}

static int save(const char *path) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_tensor_set_item(ag_params_add(ps, "w", 1, (int[]){3}), 1, 2.5);
    ag_err err;
    int rc = ag_params_save(ps, path, NULL, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    ag_params_free(ps);
    return rc;
}

static const char *name_of(const char *path, const char *suffix, long pid, const char *serial) {
    static char bufs[8][700];
    static int next;
    char *b = bufs[next];
    next = (next + 1) % 8;
    snprintf(b, sizeof bufs[0], "%s%s%ld%s", path, suffix, pid, serial);
    return b;
}

// A save killed in the middle of writing (by SIGXFSZ at the first write past
// a 16-byte file-size limit) leaves its temporary file: returns its name.
static const char *killed_save(const char *path) {
    static char tmp[700];
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        testing_file_size_limit(16);
        signal(SIGXFSZ, SIG_DFL);
        save(path);
        _exit(0);  // not reached if the limit did its job
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.0", path, (long)child);
    return tmp;
}

// Each killed save leaves its temporary, and removes the one before it: the
// pile never grows past one; a save that completes leaves none.
static void temporaries_of_killed_saves_are_removed(void) {
    const char *path = testing_path("model.safetensors");
    for (int i = 0; i < 3; i++) {
        const char *tmp = killed_save(path);
        CHECK(exists(tmp));
        CHECK(testing_count_files(".tmp.") == 1);
    }
    CHECK(save(path) == 0);
    CHECK(exists(path));
    CHECK(testing_count_files(".tmp.") == 0);
    testing_remove_files("model");
}

// The same clean-up for a path given without a directory (the current one).
static void relative_path_in_the_current_directory(void) {
    char here[512];
    CHECK(getcwd(here, sizeof here) != NULL);
    CHECK(chdir(testing_tmpdir()) == 0);
    const char *stale = name_of("rel.safetensors", ".tmp.", dead_pid(), ".3");
    testing_write_file(stale, "x", 1);
    CHECK(save("rel.safetensors") == 0);
    CHECK(!exists(stale));
    CHECK(exists("rel.safetensors"));
    CHECK(chdir(here) == 0);
    testing_remove_files("rel");
}

static void only_dead_temporaries_of_this_path_are_removed(void) {
    const char *path = testing_path("keep.safetensors");
    const char *other = testing_path("other.safetensors");
    long dead = dead_pid();
    const char *stale = name_of(path, ".tmp.", dead, ".0");
    const char *kept[] = {
        name_of(path, ".tmp.", (long)getpid(), ".5"),  // this process: maybe another thread
        name_of(path, ".tmp.", 1, ".0"),               // pid 1 is alive
        name_of(other, ".tmp.", dead, ".0"),           // another path's
        name_of(path, ".tmp.", dead, ".0x"),           // not a temporary's name
        name_of(path, ".tmp.", dead, ""),
        name_of(path, ".tmpx.", dead, ".0"),
    };
    int n = (int)(sizeof kept / sizeof kept[0]);
    testing_write_file(stale, "x", 1);
    for (int i = 0; i < n; i++) testing_write_file(kept[i], "x", 1);
    CHECK(save(path) == 0);
    CHECK(!exists(stale));
    for (int i = 0; i < n; i++) {
        if (!exists(kept[i])) fprintf(stderr, "removed: %s\n", kept[i]);
        CHECK(exists(kept[i]));
    }
    testing_remove_files(".tmp");
    testing_remove_files("keep");
}

// A file name may be 255 bytes long; "<name>.tmp.<pid>.<n>" would then exceed the
// limit, and the save could make no temporary. Temporaries cut a long name to 229
// bytes, between characters (here 228 'a's and 11 2-byte characters: 250 bytes), and
// the next save still finds a killed save's temporary by that cut name.
static void a_name_near_the_length_limit_saves_and_cleans_up(void) {
    char *name = malloc(251);
    memset(name, 'a', 228);
    for (int i = 0; i < 11; i++) memcpy(name + 228 + 2 * i, "\xc3\xa9", 2);
    name[250] = '\0';
    const char *path = testing_path(name);
    name[228] = '\0';
    const char *cut = testing_path(name);
    free(name);
    CHECK(save(path) == 0);
    CHECK(exists(path));
    CHECK(testing_count_files(".tmp.") == 0);
    killed_save(path);
    CHECK(testing_count_files(".tmp.") == 1);
    const char *stale = name_of(cut, ".tmp.", dead_pid(), ".0");
    testing_write_file(stale, "x", 1);
    CHECK(testing_count_files(".tmp.") == 2);
    CHECK(save(path) == 0);
    CHECK(!exists(stale));
    CHECK(testing_count_files(".tmp.") == 0);
    testing_remove_files("aaaa");
}

// A directory with a temporary's name is not a file to remove.
static void a_directory_is_left_alone(void) {
    const char *path = testing_path("dir.safetensors");
    const char *stale = name_of(path, ".tmp.", dead_pid(), ".1");
    CHECK(mkdir(stale, 0700) == 0);
    CHECK(save(path) == 0);
    CHECK(exists(stale));
    rmdir(stale);
    testing_remove_files("dir");
}

int main(void) {
    RUN(temporaries_of_killed_saves_are_removed);
    RUN(relative_path_in_the_current_directory);
    RUN(only_dead_temporaries_of_this_path_are_removed);
    RUN(a_directory_is_left_alone);
    RUN(a_name_near_the_length_limit_saves_and_cleans_up);
    testing_remove_tmpdir();
    return testing_summary();
}
