// Files and pages are the same bytes whatever the locale a program set, and a file
// written under one locale reads back under another. Run as `test_locale LOCALE` with a
// locale whose decimal point is not '.' (de_DE.UTF-8: ','; ps_AF.UTF-8: U+066B, two
// bytes; de_DE.ISO-8859-1: ',', and isalpha true above 0x7f): CMake registers it only
// with a locale that can be set (tests/CMakeLists.txt), and .ci/run generates them, so
// that it never skips.
#define _POSIX_C_SOURCE 200809L

#include <locale.h>
#include <stdlib.h>

#include "../src/core/internal.h"
#include "testing.h"
#include "testing_files.h"

static const char *other_locale;  // argv[1]

// Sets the C locale (other = false) or the one under test; false when it cannot be set.
static bool use_locale(bool other) {
    if (setlocale(LC_ALL, other ? other_locale : "C")) return true;
    fprintf(stderr, "  cannot set locale %s\n", other ? other_locale : "C");
    return false;
}

static bool same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *da = testing_read_file(a, &na), *db = testing_read_file(b, &nb);
    bool same = da && db && na == nb && memcmp(da, db, na) == 0;
    if (!same) fprintf(stderr, "  %s and %s differ\n", a, b);
    free(da);
    free(db);
    return same;
}

static bool file_has(const char *path, const char *part) {
    size_t n;
    unsigned char *d = testing_read_file(path, &n);
    bool has = false;
    for (size_t i = 0, k = strlen(part); d && !has && i + k <= n; i++)
        has = memcmp(d + i, part, k) == 0;
    if (!has) fprintf(stderr, "  %s lacks \"%s\"\n", path, part);
    free(d);
    return has;
}

// The locale's point is really another: else the test would prove nothing.
static void test_locale_point_is_not_dot(void) {
    CHECK(use_locale(true));
    char s[32];
    snprintf(s, sizeof s, "%.1f", 1.5);
    CHECK(strcmp(s, "1.5") != 0);
    CHECK(strtod("1.5", NULL) != 1.5);
    CHECK(use_locale(false));
}

// agi_format_g writes '.', agi_strtod_c reads it and stops at the locale's point, as the
// C locale's printf and strtod do.
static void test_numbers_take_dot(void) {
    CHECK(use_locale(true));
    char s[64];
    CHECK(agi_format_g(s, sizeof s, 4, 0.5) == 3 && !strcmp(s, "0.5"));
    CHECK(agi_format_g(s, sizeof s, 17, -0.1) == 20 && !strcmp(s, "-0.10000000000000001"));
    CHECK(agi_format_g(s, sizeof s, 2, 1.5e-12) == 7 && !strcmp(s, "1.5e-12"));
    CHECK(agi_format_g(s, 4, 4, 0.125) == 5 && !strcmp(s, "0.1"));  // cut as snprintf cuts
    char *end;
    CHECK(agi_strtod_c("0.001", &end) == 0.001 && *end == '\0');
    CHECK(agi_strtod_c(" -2.5e3x", &end) == -2500 && !strcmp(end, "x"));
    CHECK(agi_strtod_c("0x1.8p1", &end) == 3 && *end == '\0');
    CHECK(agi_strtod_c("inf", &end) == INFINITY && *end == '\0');
    const char *point = localeconv()->decimal_point;
    char comma[16];
    snprintf(comma, sizeof comma, "1%s5", point);
    CHECK(agi_strtod_c(comma, &end) == 1 && end == comma + 1);
    CHECK(agi_strtod_c("abc", &end) == 0 && !strcmp(end, "abc"));
    CHECK(use_locale(false));
}

// A checkpoint of Adam (lr 0.001, weight_decay 0.25) written under either locale is the
// same file, "0.001" in its metadata, and loads under either.
static void save(const char *path) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_params_add(ps, "w", 1, (int[]){3});
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    c.lr = 0.001;
    c.weight_decay = 0.25;
    ag_optim *o = ag_optim_new(ps, &c);
    ag_err err;
    if (ag_checkpoint_save(ps, ag_optim_state(o), path, NULL, &err) != 0) {
        fprintf(stderr, "  save: %s\n", err.msg);
        CHECK(false);
    }
    ag_optim_free(o);
    ag_params_free(ps);
}

static double loaded_lr(const char *path) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_params_add(ps, "w", 1, (int[]){3});
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    ag_err err;
    double lr = -1;
    if (ag_checkpoint_load(ps, ag_optim_state(o), path, NULL, &err) == 0) lr = ag_optim_lr(o);
    else fprintf(stderr, "  load: %s\n", err.msg);
    ag_optim_free(o);
    ag_params_free(ps);
    return lr;
}

static void test_checkpoint_across_locales(void) {
    char in_c[512], in_other[512];
    snprintf(in_c, sizeof in_c, "%s", testing_path("c.safetensors"));
    snprintf(in_other, sizeof in_other, "%s", testing_path("other.safetensors"));
    CHECK(use_locale(false));
    save(in_c);
    CHECK(use_locale(true));
    save(in_other);
    CHECK(same_file(in_c, in_other));
    CHECK(file_has(in_other, "\"optimizer.lr\":\"0.001\""));
    CHECK(file_has(in_other, "\"optimizer.weight_decay\":\"0.25\""));
    CHECK(loaded_lr(in_c) == 0.001);  // the C locale's file, read under the other
    CHECK(use_locale(false));
    CHECK(loaded_lr(in_other) == 0.001);
}

// A tape of scale(x, 1.5) then sum, x = 0.5 1.5 2.5, run backward.
static ag_tape *small_tape(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tape_tensor(tp, AG_F32, 1, (int[]){3});
    for (int i = 0; i < 3; i++) ag_tensor_set_item(x, (size_t)i, 0.5 + i);
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 1.5)));
    return tp;
}

static void write_dot(const char *path) {
    ag_tape *tp = small_tape();
    FILE *f = fopen(path, "w");
    CHECK(f);
    if (f) {
        ag_tape_dot(tp, f);
        fclose(f);
    }
    ag_tape_free(tp);
}

static void test_tape_dot_across_locales(void) {
    char in_c[512], in_other[512];
    snprintf(in_c, sizeof in_c, "%s", testing_path("c.dot"));
    snprintf(in_other, sizeof in_other, "%s", testing_path("other.dot"));
    CHECK(use_locale(false));
    write_dot(in_c);
    CHECK(use_locale(true));
    write_dot(in_other);
    CHECK(same_file(in_c, in_other));
    CHECK(file_has(in_other, "value  0.75 2.25 3.75\\l       norm 4.437\\l"));
    CHECK(use_locale(false));
}

static void write_page(const char *path) {
    ag_tape *tp = small_tape();
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.zero_below = 1.5e-12;
    ag_err err;
    if (ag_tape_html(tp, path, &o, &err) != 0) {
        fprintf(stderr, "  tape_html: %s\n", err.msg);
        CHECK(false);
    }
    ag_tape_free(tp);
}

static void test_tape_page_across_locales(void) {
    char in_c[512], in_other[512];
    snprintf(in_c, sizeof in_c, "%s", testing_path("c.html"));
    snprintf(in_other, sizeof in_other, "%s", testing_path("other.html"));
    CHECK(use_locale(false));
    write_page(in_c);
    CHECK(use_locale(true));
    write_page(in_other);
    CHECK(same_file(in_c, in_other));
    CHECK(file_has(in_other, "\"zero_below\":\"1.5e-12\""));
    CHECK(file_has(in_other, "\"d\":\"1.5 1.5 1.5\""));
    CHECK(use_locale(false));
}

// An op description reads the same in every locale: its letters are ASCII letters. In
// de_DE.ISO-8859-1 isalpha takes byte 0xE4 ('a' umlaut) for one, and as a letter it
// indexed the tables of sizes at -28.
static ag_tensor *build_relu(ag_tape *tp, ag_tensor *const in[], const void *args) {
    (void)args;
    return ag_relu(tp, in[0]);
}

static void refused_spec(const char *dims, const char *sizes, char *failure, size_t size) {
    ag_op_spec spec = {"relu", build_relu, NULL, 1, {{.name = "x", .dims = dims}}, sizes};
    ag_op_check_opts o = ag_op_check_defaults();
    o.out = NULL;
    ag_op_check_result r;
    CHECK(!ag_op_check(&spec, &o, &r));
    snprintf(failure, size, "%s", r.first_failure);
}

static void test_op_spec_letters_are_ascii(void) {
    const char *cases[][2] = {{"\xe4", ""}, {"N \xe4", "\xe4%2"}, {"N", "\xe4>3"}};
    for (int i = 0; i < 3; i++) {
        char in_c[256], in_other[256];
        CHECK(use_locale(false));
        refused_spec(cases[i][0], cases[i][1], in_c, sizeof in_c);
        CHECK(use_locale(true));
        refused_spec(cases[i][0], cases[i][1], in_other, sizeof in_other);
        if (strcmp(in_c, in_other) != 0)
            fprintf(stderr, "  case %d: C \"%s\", %s \"%s\"\n", i, in_c, other_locale, in_other);
        CHECK(!strcmp(in_c, in_other));
    }
    CHECK(use_locale(false));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_locale LOCALE (one whose decimal point is not '.')\n");
        return 2;
    }
    other_locale = argv[1];
    RUN(test_locale_point_is_not_dot);
    RUN(test_numbers_take_dot);
    RUN(test_checkpoint_across_locales);
    RUN(test_tape_dot_across_locales);
    RUN(test_tape_page_across_locales);
    RUN(test_op_spec_letters_are_ascii);
    testing_remove_tmpdir();
    return testing_summary();
}
