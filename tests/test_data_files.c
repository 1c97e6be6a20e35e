// Dataset files: save then load gives the same dataset and the same bytes,
// saving is atomic, and every kind of malformed file is rejected with one
// line naming the file, the line and the problem. Random corruptions of valid
// files (pcg32-driven) must load correctly or be rejected, never crash.
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seqdata.h"
#include "testing.h"
#include "testing_files.h"

static char tmp_dir[64];
static char path_buf[256];

static const char *tmp_path(const char *name) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", tmp_dir, name);
    return path_buf;
}

static void write_bytes(const char *path, const char *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        CHECK(!"cannot write a test file");
        return;
    }
    fwrite(bytes, 1, n, f);
    fclose(f);
}

// Reads a whole (small) file; *n gets its size. Free with free().

static bool same_dataset(const ag_seqdata *a, const ag_seqdata *b) {
    return a->task == b->task && a->length == b->length && a->count == b->count &&
           a->seq_len == b->seq_len && a->vocab == b->vocab && a->source_len == b->source_len &&
           a->target_len == b->target_len && a->scored_from == b->scored_from &&
           a->sep_token == b->sep_token && strcmp(a->alphabet, b->alphabet) == 0 &&
           a->has_seed == b->has_seed && a->seed == b->seed && a->stream == b->stream &&
           memcmp(a->tokens, b->tokens, (size_t)a->count * (size_t)a->seq_len * 4) == 0;
}

// ---- Round trips --------------------------------------------------------------------------
static void test_save_then_load_gives_the_same_dataset_and_bytes(void) {
    const int lengths[3] = {16, 7, 8};
    for (int t = 0; t < 3; t++) {
        ag_seqdata *d =
            ag_seqdata_generate((ag_task)t, lengths[t], 100, 12345678901234567ULL, (uint64_t)t + 1);
        ag_err err = {{0}};
        const char *p1 = tmp_path("one.txt");
        CHECK(ag_seqdata_save(d, p1, &err) == 0);
        ag_seqdata *e = ag_seqdata_load(p1, &err);
        CHECK(e != NULL);
        if (!e) {
            fprintf(stderr, "  %s\n", err.msg);
            ag_seqdata_free(d);
            continue;
        }
        CHECK(same_dataset(d, e));
        size_t n1 = 0, n2 = 0;
        char *b1 = (char *)testing_read_file(p1, &n1);
        CHECK(ag_seqdata_save(e, tmp_path("two.txt"), &err) == 0);
        char *b2 = (char *)testing_read_file(tmp_path("two.txt"), &n2);
        CHECK(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
        // Header plus one line of seq_len + 1 bytes per sequence.
        CHECK(n1 > (size_t)100 * (size_t)(d->seq_len + 1));
        free(b1);
        free(b2);
        ag_seqdata_free(d);
        ag_seqdata_free(e);
    }
    remove(tmp_path("one.txt"));
    remove(tmp_path("two.txt"));
}

static void test_shuffled_dataset_saves_without_seed(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 4, 20, 1, 1);
    ag_pcg32 rng = ag_pcg32_make(1, 2);
    ag_seqdata_shuffle(d, &rng);
    ag_err err;
    CHECK(ag_seqdata_save(d, tmp_path("s.txt"), &err) == 0);
    size_t n;
    char *bytes = (char *)testing_read_file(tmp_path("s.txt"), &n);
    CHECK(bytes && !strstr(bytes, "\nseed "));
    free(bytes);
    ag_seqdata *e = ag_seqdata_load(tmp_path("s.txt"), &err);
    CHECK(e && !e->has_seed && same_dataset(d, e));
    ag_seqdata_free(d);
    ag_seqdata_free(e);
    remove(tmp_path("s.txt"));
}

static const char copy_file[] =
    "# attograd sequence dataset v1\n"
    "# a comment\n"
    "task copy\n"
    "alphabet 0123456789|\n"
    "separator |\n"
    "length 3\n"
    "count 2\n"
    "seed 7 stream 8\n"
    "data\n"
    "123|123\n"
    "450|450\n";

static void test_crlf_file_loads_like_lf(void) {
    char crlf[512];
    size_t o = 0;
    for (const char *c = copy_file; *c; c++) {
        if (*c == '\n') crlf[o++] = '\r';
        crlf[o++] = *c;
    }
    write_bytes(tmp_path("lf.txt"), copy_file, strlen(copy_file));
    write_bytes(tmp_path("crlf.txt"), crlf, o);
    ag_err err;
    ag_seqdata *a = ag_seqdata_load(tmp_path("lf.txt"), &err);
    ag_seqdata *b = ag_seqdata_load(tmp_path("crlf.txt"), &err);
    CHECK(a && b && same_dataset(a, b));
    CHECK(a && a->has_seed && a->seed == 7 && a->stream == 8 && a->count == 2);
    ag_seqdata_free(a);
    ag_seqdata_free(b);
    remove(tmp_path("lf.txt"));
    remove(tmp_path("crlf.txt"));
}

// ---- Saving is atomic and refuses bad data ------------------------------------------------
static int count_temp_files(void) {
    DIR *dir = opendir(tmp_dir);
    int n = 0;
    struct dirent *e;
    while (dir && (e = readdir(dir))) n += strstr(e->d_name, ".tmp.") != NULL;
    if (dir) closedir(dir);
    return n;
}

static void test_save_replaces_the_file_and_leaves_no_temporary(void) {
    const char *p = tmp_path("replace.txt");
    write_bytes(p, "old contents\n", 13);
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_REVERSE, 5, 30, 2, 2);
    ag_err err;
    CHECK(ag_seqdata_save(d, p, &err) == 0);
    ag_seqdata *e = ag_seqdata_load(p, &err);
    CHECK(e && same_dataset(d, e));
    CHECK(count_temp_files() == 0);
    ag_seqdata_free(d);
    ag_seqdata_free(e);
    remove(p);
}

static void test_save_refuses_a_broken_sequence_and_keeps_the_old_file(void) {
    const char *p = tmp_path("keep.txt");
    write_bytes(p, "old contents\n", 13);
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 4, 10, 1, 1);
    d->tokens[3 * d->seq_len + 6] = (d->tokens[3 * d->seq_len + 1] + 1) % 10;  // seq 3, column 7
    ag_err err = {{0}};
    CHECK(ag_seqdata_save(d, p, &err) != 0);
    CHECK(strncmp(err.msg, p, strlen(p)) == 0);
    CHECK(strstr(err.msg,
                 "not saved: sequence 3 is not a valid copy sequence: column 7: "
                 "second half differs from the first"));
    size_t n;
    char *bytes = (char *)testing_read_file(p, &n);
    CHECK(bytes && n == 13 && memcmp(bytes, "old contents\n", 13) == 0);
    free(bytes);
    d->tokens[5] = 57;  // an id outside the vocabulary: reported, not used as an index
    CHECK(ag_seqdata_save(d, p, &err) != 0);
    CHECK(strstr(err.msg,
                 "sequence 0 is not a valid copy sequence: column 6: token id 57 is "
                 "outside the vocabulary (0-10)"));
    CHECK(count_temp_files() == 0);
    ag_seqdata_free(d);
    remove(p);
}

static void test_save_into_a_missing_directory_fails_cleanly(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 4, 2, 1, 1);
    ag_err err = {{0}};
    const char *p = tmp_path("no/such/dir/x.txt");
    CHECK(ag_seqdata_save(d, p, &err) != 0);
    CHECK(strncmp(err.msg, p, strlen(p)) == 0);
    CHECK(strstr(err.msg, ": the directory "));
    CHECK(strstr(err.msg, "No such file or directory"));
    CHECK(ag_seqdata_save(d, NULL, &err) != 0);
    CHECK(ag_seqdata_save(NULL, tmp_path("x.txt"), &err) != 0);
    CHECK(strstr(err.msg, "not saved: the dataset is NULL"));
    CHECK(ag_seqdata_save(d, tmp_path("x.txt"), NULL) == 0);  // err may be NULL
    remove(tmp_path("x.txt"));
    ag_seqdata_free(d);
}

static void test_failed_write_keeps_the_old_file_and_no_temporary(void) {
    const char *p = tmp_path("full.txt");
    write_bytes(p, "old contents\n", 13);
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 16, 2000, 1, 1);  // ~66 KB of text
    testing_file_size limit = testing_file_size_limit(4096);
    ag_err err = {{0}};
    int rc = ag_seqdata_save(d, p, &err);
    testing_file_size_restore(limit);

    CHECK(rc != 0);
    CHECK(strncmp(err.msg, p, strlen(p)) == 0);
    CHECK(strstr(err.msg, "File too large") && strstr(err.msg, "was left as it was"));
    size_t n;
    char *bytes = (char *)testing_read_file(p, &n);
    CHECK(bytes && n == 13 && memcmp(bytes, "old contents\n", 13) == 0);
    free(bytes);
    CHECK(count_temp_files() == 0);
    ag_seqdata_free(d);
    remove(p);
}

// ---- Malformed files ----------------------------------------------------------------------
// Loads `text` and checks that it is rejected with "<path>:<line>: ..." where
// the rest contains `problem`, all on one line.
static void expect_reject_bytes(const char *text, size_t n, int line, const char *problem,
                                int src_line) {
    const char *p = tmp_path("bad.txt");
    write_bytes(p, text, n);
    ag_err err = {{0}};
    ag_seqdata *d = ag_seqdata_load(p, &err);
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s:%d: ", p, line);
    bool ok = d == NULL && strncmp(err.msg, prefix, strlen(prefix)) == 0 &&
              strstr(err.msg + strlen(prefix), problem) != NULL && !strchr(err.msg, '\n');
    if (!ok) {
        fprintf(stderr, "  case at line %d: got %s\n    expected %s%s...\n", src_line,
                d ? "(loaded)" : err.msg, prefix, problem);
        CHECK(!"malformed file not rejected as expected");
    }
    ag_seqdata_free(d);
    remove(p);
}

static void expect_reject(const char *text, int line, const char *problem, int src_line) {
    expect_reject_bytes(text, strlen(text), line, problem, src_line);
}

#define HEAD "# attograd sequence dataset v1\n"
#define COPY_HEAD HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 3\ncount 2\ndata\n"
#define RECALL_HEAD                                                                   \
    HEAD "task recall\nalphabet 0123456789|abcdefghijklmnop\nseparator |\nlength 2\n" \
         "count 1\ndata\n"
#define REJECT(text, line, problem) expect_reject(text, line, problem, __LINE__)

static void test_rejects_empty_and_foreign_files(void) {
    REJECT("", 1, "empty file");
    REJECT("hello\n", 1,
           "not an attograd sequence dataset: the first line must be "
           "'# attograd sequence dataset v1'");
    REJECT("# attograd sequence dataset v2\ntask copy\n", 1,
           "unsupported format version 'v2' (this reader knows v1)");
    REJECT("\n", 1, "not an attograd sequence dataset");
    REJECT("# attograd sequence dataset v1", 1, "file ends inside the header (truncated file?)");
}

static void test_rejects_bad_header_keys(void) {
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\ncolour red\n", 5,
           "unknown header key 'colour', where 'length' belongs");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\ncount 2\nlength 3\n", 5,
           "header 'count' out of order: 'length' belongs here");
    REJECT(HEAD "task copy\ntask copy\n", 3, "header 'task' appears twice");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 3\ndata\n123|123\n", 6,
           "missing header 'count' before 'data'");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 3\ncount 1\ndata now\n", 7,
           "'data' takes no value");
    REJECT(HEAD "task\n", 2, "header 'task' has no value");
    REJECT(HEAD "task copy\n\n", 3, "empty line in the header, where 'alphabet' belongs");
    REJECT(HEAD "123|123\n", 2, "unknown header key '123|123', where 'task' belongs");
}

static void test_rejects_bad_header_values(void) {
    REJECT(HEAD "task sort\n", 2, "unknown task 'sort' (known: copy, reverse, recall)");
    REJECT(HEAD "task copy \n", 2, "unknown task 'copy '");
    REJECT(HEAD "task copy\nalphabet 0123456789\n", 3,
           "alphabet '0123456789' differs from the alphabet of task copy, '0123456789|'");
    REJECT(HEAD "task recall\nalphabet 0123456789|\n", 3,
           "differs from the alphabet of task recall, '0123456789|abcdefghijklmnop'");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator ,\n", 4,
           "separator ',' differs from the separator of task copy, '|'");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 3x\n", 5,
           "length '3x' is not a whole number from 1 to 1024");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 0\n", 5,
           "length '0' is not a whole number from 1 to 1024");
    REJECT(HEAD "task recall\nalphabet 0123456789|abcdefghijklmnop\nseparator |\nlength 17\n", 5,
           "length '17' is not a whole number from 1 to 16 (the range of task recall)");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 3\ncount -1\n", 6,
           "count '-1' is not a whole number from 1 to 16777216");
    REJECT(HEAD
           "task copy\nalphabet 0123456789|\nseparator |\nlength 3\n"
           "count 99999999999999999999999\n",
           6, "count '99999999999999999999999' is not a whole number");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 3\ncount 1\nseed 1\n", 7,
           "expected 'seed <number> stream <number>', found 'seed 1'");
    REJECT(HEAD
           "task copy\nalphabet 0123456789|\nseparator |\nlength 3\ncount 1\n"
           "seed 1 stream 18446744073709551616\n",
           7, "expected 'seed <number> stream <number>'");
}

static void test_rejects_wrong_counts(void) {
    REJECT(COPY_HEAD "123|123\n", 9,
           "file ends after 1 of the 2 sequences the header's count promises (truncated file?)");
    REJECT(COPY_HEAD "123|123\n450|450\n777|777\n", 10,
           "more lines than the header's count of 2 sequences; expected the end of the file");
    REJECT(COPY_HEAD "123|123\n450|450\n\n", 10, "more lines than the header's count");
    REJECT(COPY_HEAD, 8, "file ends after 0 of the 2 sequences");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 3\n", 6,
           "file ends inside the header, where 'count' belongs (truncated file?)");
    REJECT(HEAD "task copy\nalphabet 0123456789|\nseparator |\nlength 3\ncount 2\ndata", 7,
           "file ends right after 'data' (truncated file?)");
}

static void test_rejects_bad_lines(void) {
    REJECT(COPY_HEAD "123|123\n12x|12x\n", 9, "column 3: 'x' is not in the alphabet '0123456789|'");
    REJECT(COPY_HEAD "1234|1234\n", 8,
           "line has 9 characters, expected 7 (3 symbols, '|', 3 symbols)");
    REJECT(COPY_HEAD "123|123\n\n", 9, "empty line where sequence 2 of 2 belongs");
    REJECT(COPY_HEAD "1231234\n", 8, "column 4: expected the separator '|', found '1'");
    REJECT(COPY_HEAD "12|3123\n", 8, "column 3: expected a symbol (0-9), found '|'");
    REJECT(COPY_HEAD "123|124\n", 8,
           "column 7: second half differs from the first: '4' where the copy has '3'");
    REJECT(COPY_HEAD "123 123\n", 8, "column 4: ' ' is not in the alphabet");
    REJECT(COPY_HEAD "123|123\n# comment\n", 9, "line has 9 characters, expected 7");
    REJECT(COPY_HEAD "12\r|123\n", 8, "column 3: byte 0x0d is not in the alphabet");
}

static void test_rejects_broken_reverse_and_recall_sequences(void) {
    REJECT(HEAD
           "task reverse\nalphabet 0123456789|\nseparator |\nlength 3\ncount 1\ndata\n"
           "123|123\n",
           8, "column 5: second half is not the first reversed: '1' where the reversal has '3'");
    REJECT(RECALL_HEAD "a1b2|b1\n", 8,
           "column 7: answer '1' differs from '2', the value stored with key 'b' at column 3");
    REJECT(RECALL_HEAD "a1b2|c1\n", 8, "column 6: query key 'c' is not among the keys");
    REJECT(RECALL_HEAD "a1a2|a1\n", 8, "column 3: key 'a' repeats the key at column 1");
    REJECT(RECALL_HEAD "ab12|a1\n", 8, "column 2: expected a value (0-9), found 'b'");
    REJECT(RECALL_HEAD "a1b2|1a\n", 8, "column 6: expected a key (a-p), found '1'");
    REJECT(RECALL_HEAD "a1q2|a1\n", 8, "column 3: 'q' is not in the alphabet");
    REJECT(RECALL_HEAD "a1b2b2|\n", 8, "column 5: expected the separator '|', found 'b'");
}

static void test_rejects_truncated_files(void) {
    REJECT(COPY_HEAD "123|123\n45", 9,
           "file ends in the middle of a line: 2 of 7 characters (truncated file?)");
    REJECT(COPY_HEAD "123|123\n450|450", 9,
           "the last line has no newline at its end (truncated file?)");
    REJECT(HEAD "task co", 2, "unknown task 'co'");
    REJECT(HEAD "task copy\nalpha", 3, "unknown header key 'alpha'");
}

static void test_rejects_overlong_lines_and_nul_bytes(void) {
    char text[8192];
    size_t n = (size_t)snprintf(text, sizeof text, COPY_HEAD);
    memset(text + n, '1', 5000);
    text[n + 5000] = '\n';
    expect_reject_bytes(text, n + 5001, 8, "line has 5000 characters, expected 7", __LINE__);
    // Past a limit the reader stops counting: an endless line is an error, not a hang.
    size_t big = (size_t)3 << 20;
    char *huge = malloc(big);
    if (huge) {
        n = (size_t)snprintf(huge, big, COPY_HEAD);
        memset(huge + n, '7', big - n);
        expect_reject_bytes(huge, big, 8, "line has more than 1048576 characters, expected 7",
                            __LINE__);
        memset(huge, 0, big);
        expect_reject_bytes(huge, big, 1, "not an attograd sequence dataset", __LINE__);
        free(huge);
    }
    n = (size_t)snprintf(text, sizeof text, HEAD "# ");
    memset(text + n, 'x', 300);
    text[n + 300] = '\n';
    expect_reject_bytes(text, n + 301, 2, "header line longer than 255 characters", __LINE__);
    static const char nul_data[] = COPY_HEAD "1\0003|1\0003\n";
    expect_reject_bytes(nul_data, sizeof nul_data - 1, 8,
                        "column 2: byte 0x00 is not in the alphabet", __LINE__);
    static const char nul_head[] = HEAD "task co\0py\n";
    expect_reject_bytes(nul_head, sizeof nul_head - 1, 2, "NUL byte in the header", __LINE__);
    static const char binary[] =
        "\x7f"
        "ELF\x02\x01\x01\0\0\0";
    expect_reject_bytes(binary, sizeof binary - 1, 1, "not an attograd sequence dataset", __LINE__);
}

static void test_rejects_missing_files_and_directories(void) {
    ag_err err = {{0}};
    const char *p = tmp_path("does-not-exist.txt");
    CHECK(ag_seqdata_load(p, &err) == NULL);
    CHECK(strncmp(err.msg, p, strlen(p)) == 0);
    CHECK(strstr(err.msg, ": cannot open: No such file or directory"));
    CHECK(ag_seqdata_load(tmp_dir, &err) == NULL);  // a directory
    CHECK(strncmp(err.msg, tmp_dir, strlen(tmp_dir)) == 0);
    CHECK(ag_seqdata_load(NULL, &err) == NULL);
    CHECK(ag_seqdata_load(p, NULL) == NULL);  // err may be NULL
}

// An empty path: the line began ": cannot open", naming no file.
static void test_an_empty_path_is_named_in_the_message(void) {
    ag_err err = {{0}};
    CHECK(ag_seqdata_load("", &err) == NULL);
    CHECK(strcmp(err.msg, "the path is empty; name a dataset file") == 0);
    CHECK(ag_seqdata_load("", NULL) == NULL);
}

// Opening a FIFO blocked until a writer came (copy_task --data waited forever); a device
// such as /dev/zero would be read without end.
static void test_rejects_a_fifo_and_a_device_without_waiting(void) {
    ag_err err = {{0}};
    const char *p = tmp_path("fifo.txt");
    CHECK(mkfifo(p, 0600) == 0);
    CHECK(ag_seqdata_load(p, &err) == NULL);
    char want[600];
    snprintf(want, sizeof want, "%s: is not a regular file", p);
    CHECK(strcmp(err.msg, want) == 0);
    CHECK(ag_seqdata_load("/dev/zero", &err) == NULL);
    CHECK(strcmp(err.msg, "/dev/zero: is not a regular file") == 0);
    unlink(p);
}

// The loader checked the name (stat) and then opened the name (fopen): a FIFO put there
// between the two (here right after the stat, through the hook of testing_files.h) hung
// it in the open, waiting for a writer that never came; and the file it read was not
// the file it had checked. Checked through what it opened, it reads the file it checks.
static int load_the_swapped_path(void *path) {
    ag_err err = {{0}};
    ag_seqdata *d = ag_seqdata_load(path, &err);
    const int loaded = d && d->count == 5 && d->length == 4;
    ag_seqdata_free(d);
    return loaded ? 0 : 1;
}

static void test_a_fifo_swapped_in_after_the_check_does_not_hang_the_load(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_COPY, 4, 5, 1, 1);
    ag_err err = {{0}};
    char path[300], fifo[300];
    snprintf(path, sizeof path, "%s", tmp_path("swapped.txt"));
    snprintf(fifo, sizeof fifo, "%s", tmp_path("swapped.fifo"));
    CHECK(ag_seqdata_save(d, path, &err) == 0);
    CHECK(mkfifo(fifo, 0600) == 0);
    testing_swap_path = path;
    testing_swap_with = fifo;
    int status = -1;
    CHECK(testing_returns_within(load_the_swapped_path, path, 1.0, &status));
    CHECK(status == 0);  // the file as it was when opened
    testing_swap_path = testing_swap_with = NULL;
    unlink(path);
    unlink(fifo);
    ag_seqdata_free(d);
}

// The file was opened with fopen(path, "rb"): its descriptor, open for the whole load,
// went into every program another thread of the process started meanwhile.
static void test_the_load_opens_its_file_close_on_exec(void) {
    ag_seqdata *d = ag_seqdata_generate(AG_TASK_REVERSE, 5, 3, 2, 2);
    ag_err err = {{0}};
    const char *p = tmp_path("cloexec.txt");
    CHECK(ag_seqdata_save(d, p, &err) == 0);
    testing_fclose_count = testing_fclose_inheritable = 0;
    ag_seqdata *e = ag_seqdata_load(p, &err);
    CHECK(e != NULL);
    CHECK(testing_fclose_count == 1);
    CHECK(testing_fclose_inheritable == 0);
    ag_seqdata_free(e);
    ag_seqdata_free(d);
    unlink(p);
}

// A path longer than the message (one past PATH_MAX here) filled it, and the problem was
// cut off: the line named no problem. Past 200 bytes the path is shown as its first 80
// bytes, "...", and its last 100, and the problem follows.
static void test_a_long_path_leaves_room_for_the_problem(void) {
    static char path[5000];
    for (size_t i = 0; i + 1 < sizeof path; i++) path[i] = i % 2 ? '/' : 'd';
    path[sizeof path - 2] = 'f';
    ag_err err = {{0}};
    CHECK(ag_seqdata_load(path, &err) == NULL);
    char want[400];
    snprintf(want, sizeof want, "%.80s...%s: cannot open: %s", path, path + sizeof path - 101,
             strerror(ENAMETOOLONG));
    CHECK(strcmp(err.msg, want) == 0);
    // And one that names a file, a FIFO: the problem is there too.
    char name[201], outer[300], dir[700];
    memset(name, 'n', 200);
    name[200] = 0;
    snprintf(outer, sizeof outer, "%s/%s", tmp_dir, name);
    snprintf(dir, sizeof dir, "%s/%s", outer, name);
    CHECK(mkdir(outer, 0700) == 0 && mkdir(dir, 0700) == 0);
    char fifo[800];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK(ag_seqdata_load(fifo, &err) == NULL);
    const size_t len = strlen(fifo);
    snprintf(want, sizeof want, "%.80s...%s: is not a regular file", fifo, fifo + len - 100);
    CHECK(strcmp(err.msg, want) == 0);
    unlink(fifo);
    rmdir(dir);
    rmdir(outer);
}

// ---- Random corruption never crashes -----------------------------------------------------
// The loaded dataset must satisfy what the loader promises; checked by hand
// here, independently of the library's checker.
static bool loaded_dataset_is_valid(const ag_seqdata *d) {
    if (d->count < 1 || d->seq_len < 3) return false;
    for (int i = 0; i < d->count; i++) {
        const int32_t *s = ag_seqdata_seq(d, i);
        for (int t = 0; t < d->seq_len; t++)
            if (s[t] < 0 || s[t] >= d->vocab) return false;
        if (s[d->source_len] != d->sep_token) return false;
        if (d->task == AG_TASK_RECALL) {
            int found = 0;
            for (int p = 0; p < d->length; p++)
                found += s[2 * p] == s[d->source_len + 1] && s[2 * p + 1] == s[d->seq_len - 1];
            if (found != 1) return false;
        } else {
            for (int k = 0; k < d->length; k++) {
                int32_t want = d->task == AG_TASK_COPY ? s[k] : s[d->length - 1 - k];
                if (s[d->length + 1 + k] != want) return false;
            }
        }
    }
    return true;
}

// Bytes that matter to the format, so mutations often produce near-valid files.
static unsigned char interesting_byte(ag_pcg32 *rng) {
    static const char pool[] = "0123456789|abcdefghijklmnopq\n\r #\0 x";
    if (ag_pcg32_bounded(rng, 4) == 0) return (unsigned char)ag_pcg32_bounded(rng, 256);
    return (unsigned char)pool[ag_pcg32_bounded(rng, sizeof pool - 1)];
}

static void fuzz_file(ag_task task, int length, int count, uint64_t stream, int rounds) {
    ag_seqdata *d = ag_seqdata_generate(task, length, count, 3, stream);
    const char *p = tmp_path("fuzz.txt");
    ag_err err;
    CHECK(ag_seqdata_save(d, p, &err) == 0);
    size_t n = 0;
    char *orig = (char *)testing_read_file(p, &n);
    char *buf = malloc(n + 64);
    if (!orig || !buf) {
        CHECK(!"cannot read the saved file");
        return;
    }
    ag_pcg32 rng = ag_pcg32_make(99, stream);
    int loaded = 0, rejected = 0, bad = 0;
    for (int round = 0; round < rounds; round++) {
        memcpy(buf, orig, n);
        size_t len = n;
        int edits = 1 + (int)ag_pcg32_bounded(&rng, 3);
        for (int e = 0; e < edits && len > 0; e++) {
            size_t at = ag_pcg32_bounded(&rng, (uint32_t)len);
            switch (ag_pcg32_bounded(&rng, 5)) {
            case 0: buf[at] = (char)interesting_byte(&rng); break;  // replace
            case 1: buf[at] = (char)((unsigned char)buf[at] ^ (1u << (at % 8))); break;
            case 2:  // delete
                memmove(buf + at, buf + at + 1, len - at - 1);
                len--;
                break;
            case 3:  // insert
                if (len < n + 60) {
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = (char)interesting_byte(&rng);
                    len++;
                }
                break;
            case 4: len = at; break;  // truncate
            }
        }
        write_bytes(p, buf, len);
        ag_err fe = {{0}};
        ag_seqdata *got = ag_seqdata_load(p, &fe);
        if (got) {
            loaded++;
            bad += !loaded_dataset_is_valid(got) || got->task != task;
        } else {
            rejected++;
            bad += strncmp(fe.msg, p, strlen(p)) != 0 || fe.msg[strlen(p)] != ':' ||
                   strchr(fe.msg, '\n') != NULL;
        }
        ag_seqdata_free(got);
    }
    CHECK(bad == 0);
    CHECK(rejected > rounds / 2);
    CHECK(loaded > 0);  // some edits (in comments, seed digits, ...) keep the file valid
    free(orig);
    free(buf);
    ag_seqdata_free(d);
    remove(p);
}

// A valid file of another task, put where a task's split belongs (a recall
// file as copy/valid.txt), is refused with one line naming the file and both
// tasks, instead of reaching a model built for the other vocabulary.
static void test_file_of_another_task_is_refused_where_a_task_is_expected(void) {
    ag_seqdata *recall = ag_seqdata_generate(AG_TASK_RECALL, 4, 5, 1, 2);
    const char *path = tmp_path("valid.txt");
    ag_err err;
    CHECK(ag_seqdata_save(recall, path, &err) == 0);
    CHECK(ag_seqdata_load_task(path, AG_TASK_COPY, &err) == NULL);
    char want[400];
    snprintf(want, sizeof want, "%s: a recall dataset, where a copy dataset was expected", path);
    CHECK(strcmp(err.msg, want) == 0);
    ag_seqdata *same = ag_seqdata_load_task(path, AG_TASK_RECALL, &err);
    CHECK(same && same_dataset(same, recall));
    ag_seqdata_free(same);
    ag_seqdata_free(recall);
    remove(path);
}

static void test_random_corruptions_are_rejected_or_loaded_valid(void) {
    fuzz_file(AG_TASK_COPY, 3, 6, 1, 1500);
    fuzz_file(AG_TASK_REVERSE, 4, 5, 2, 1500);
    fuzz_file(AG_TASK_RECALL, 3, 8, 3, 1500);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "test_data_files_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_save_then_load_gives_the_same_dataset_and_bytes);
    RUN(test_shuffled_dataset_saves_without_seed);
    RUN(test_crlf_file_loads_like_lf);
    RUN(test_save_replaces_the_file_and_leaves_no_temporary);
    RUN(test_save_refuses_a_broken_sequence_and_keeps_the_old_file);
    RUN(test_save_into_a_missing_directory_fails_cleanly);
    RUN(test_failed_write_keeps_the_old_file_and_no_temporary);
    RUN(test_rejects_empty_and_foreign_files);
    RUN(test_rejects_bad_header_keys);
    RUN(test_rejects_bad_header_values);
    RUN(test_rejects_wrong_counts);
    RUN(test_rejects_bad_lines);
    RUN(test_rejects_a_fifo_and_a_device_without_waiting);
    RUN(test_a_fifo_swapped_in_after_the_check_does_not_hang_the_load);
    RUN(test_the_load_opens_its_file_close_on_exec);
    RUN(test_rejects_broken_reverse_and_recall_sequences);
    RUN(test_rejects_truncated_files);
    RUN(test_rejects_overlong_lines_and_nul_bytes);
    RUN(test_rejects_missing_files_and_directories);
    RUN(test_a_long_path_leaves_room_for_the_problem);
    RUN(test_an_empty_path_is_named_in_the_message);
    RUN(test_file_of_another_task_is_refused_where_a_task_is_expected);
    RUN(test_random_corruptions_are_rejected_or_loaded_valid);
    rmdir(tmp_dir);
    return testing_summary();
}
