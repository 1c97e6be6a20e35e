// ag_tape_html writes one self-contained page for any tape: what it holds (the nodes, the
// tensors' values and gradients at the digits asked for, what each node sends, the check),
// that it loads nothing and shows names as text, how large tapes are cut down, and how it
// fails. The page's behaviour in a browser is tests/browser/test_tape_pages.c's.
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>

#include "testing.h"
#include "testing_files.h"

static char *page;  // the last page written, as text
static size_t page_len;

// Writes tp's page with `o` (NULL: defaults) and reads it back into `page`.
static int write_page(const ag_tape *tp, const ag_tape_html_opts *o) {
    free(page);
    page = NULL;
    ag_err err = {{0}};
    int rc = ag_tape_html(tp, testing_path("page.html"), o, &err);
    if (rc) fprintf(stderr, "  ag_tape_html: %s\n", err.msg);
    page = (char *)testing_read_file(testing_path("page.html"), &page_len);
    return rc;
}

// The JSON the page's script reads.
static const char *data(void) {
    const char *open = "<script type=\"application/json\" id=\"tape-data\">";
    const char *d = page ? strstr(page, open) : NULL;
    return d ? strchr(d, '>') + 1 : "";
}

static ag_tensor *leaf(const char *name, int rows, int cols, uint64_t seed) {
    ag_pcg32 g = ag_pcg32_make(seed, 3);
    ag_tensor *t = ag_tensor_uniform(AG_F64, 2, (int[]){rows, cols}, &g, -1, 1);
    ag_tensor_set_name(t, name);
    ag_tensor_set_requires_grad(t, true);
    return t;
}

static void test_the_page_is_one_file_that_can_load_nothing(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("x", 2, 3, 1);
    ag_backward(tp, ag_sum(tp, ag_softmax(tp, x, NULL)));
    CHECK(write_page(tp, NULL) == 0);
    CHECK(page && strncmp(page, "<!DOCTYPE html>\n", 16) == 0);
    CHECK(strstr(page, "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src "
                       "'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"));
    // The policy comes before any style or script, so it governs all of them.
    CHECK(strstr(page, "Content-Security-Policy") < strstr(page, "<style>"));
    // Nothing that names another file or a server: the one URL is the SVG namespace,
    // a name the script passes to createElementNS, never fetched.
    const char *p = page;
    int urls = 0;
    while ((p = strstr(p, "://"))) {
        CHECK(strncmp(p - 4, "http://www.w3.org/2000/svg", 26) == 0);
        urls++;
        p += 3;
    }
    CHECK(urls == 1);
    CHECK(!strstr(page, " src=") && !strstr(page, " href=") && !strstr(page, "@import"));
    CHECK(!strstr(page, "fetch(") && !strstr(page, "XMLHttpRequest"));
    CHECK(strstr(page, "</html>\n") == page + page_len - 8);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void copy_forward(ag_node *n) { ag_tensor_copy(n->out, n->in[0]); }

static void test_names_and_rules_are_text_never_markup(void) {
    static const char *evil = "</script><script>alert(1)</script><b>&amp;\"'";
    static const ag_op evil_op = {"op</script>", copy_forward, NULL, "dx = <i>dy</i> & \"2\""};
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf(evil, 2, 2, 2);
    ag_tensor *y = ag_op_apply(tp, &evil_op, 1, &x, 2, (int[]){2, 2}, NULL, 0);
    ag_tensor_set_name(y, evil);
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.title = evil;
    ag_tape_html_note note = {x, evil};
    o.notes = &note;
    o.n_notes = 1;
    CHECK(write_page(tp, &o) == 0);
    // One script element of data and one of code, whatever the names hold.
    int scripts = 0;
    for (const char *p = page; p && (p = strstr(p, "</script>")); p++) scripts++;
    CHECK(scripts == 2);
    CHECK(!strstr(page, "<b>") && !strstr(page, "<script>alert"));
    CHECK(strstr(data(), "\"name\":\"\\u003c/script\\u003e\\u003cscript\\u003ealert(1)"
                         "\\u003c/script\\u003e\\u003cb\\u003e\\u0026amp;\\\"'\""));
    CHECK(strstr(page, "<title>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;"
                       "&amp;amp;&quot;&#39;</title>"));
    CHECK(strstr(data(), "\"notes\":[\"\\u003c/script"));
    CHECK(strstr(data(), "{\"op\":\"op\\u003c/script\\u003e\",\"rule\":\"dx = \\u003ci\\u003edy"
                         "\\u003c/i\\u003e \\u0026 \\\"2\\\"\""));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_a_name_that_is_not_utf8_is_shown_with_replacement_characters(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("caf\xe9 \xff", 1, 2, 3);
    ag_backward(tp, ag_sum(tp, x));
    CHECK(write_page(tp, NULL) == 0);
    CHECK(strstr(data(), "\"name\":\"caf\\ufffd \\ufffd\""));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A frozen tensor that holds a gradient buffer is read by each node through a header copy
// of its own: the page listed one tensor per copy, and a note on the tensor reached none.
// It is one tensor, with the note, and no gradient (it gets none).
static void test_a_frozen_tensor_read_twice_is_one_tensor_with_its_note(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = leaf("frozen_w", 1, 2, 4);
    ag_tensor *x = leaf("x", 1, 2, 5);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, w, x)));  // w->grad now exists
    ag_tensor_set_requires_grad(w, false);
    ag_tape_reset(tp);
    ag_backward(tp, ag_sum(tp, ag_add(tp, ag_mul(tp, w, x), ag_mul(tp, x, w))));
    ag_tape_html_opts o = ag_tape_html_defaults();
    ag_tape_html_note note = {w, "frozen"};
    o.notes = &note;
    o.n_notes = 1;
    CHECK(write_page(tp, &o) == 0);
    int named = 0;
    for (const char *p = data(); (p = strstr(p, "\"name\":\"frozen_w\"")); p++) named++;
    CHECK(named == 1);
    const char *t = strstr(data(), "\"name\":\"frozen_w\"");
    const char *next = t ? strstr(t, "{\"name\"") : NULL;  // the tensor after it
    CHECK(t && next && strstr(t, "\"node\":-1,\"rg\":false,") < next &&
          strstr(t, "\"grad\":null,\"notes\":[\"frozen\"]}") < next);
    ag_tape_free(tp);
    ag_tensor_free(w);
    ag_tensor_free(x);
}

static void test_values_and_gradients_have_the_digits_asked_for(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 2, (int[]){1, 4}, (double[]){0.123456789, -2.5e-7,
                                                                       1234567, -0.0});
    ag_tensor_set_name(x, "x");
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 3)));
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.digits = 3;
    CHECK(write_page(tp, &o) == 0);
    CHECK(strstr(data(), "\"d\":\"0.123 -2.5e-07 1.23e+06 -0\""));  // x
    CHECK(strstr(data(), "\"d\":\"0.37 -7.5e-07 3.7e+06 -0\""));    // 3 x
    CHECK(strstr(data(), "\"d\":\"3 3 3 3\""));                     // dx
    CHECK(strstr(data(), "\"digits\":3"));
    o.digits = 6;
    CHECK(write_page(tp, &o) == 0);
    CHECK(strstr(data(), "\"d\":\"0.123457 -2.5e-07 1.23457e+06 -0\""));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_nan_and_infinities_are_shown_and_counted(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){4}, (double[]){NAN, INFINITY, -INFINITY, 2});
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 1)));
    CHECK(write_page(tp, NULL) == 0);
    // By hand: min and max of the entries that are not NaN, -inf and +inf (not the one
    // finite entry, 2); the 2-norm of a vector holding a NaN is NaN.
    CHECK(strstr(data(), "\"d\":\"NaN Infinity -Infinity 2\",\"min\":\"-Infinity\","
                         "\"max\":\"Infinity\",\"norm\":\"NaN\",\"nan\":1,\"inf\":2"));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// Statistics that say what the entries are: NaN never becomes a number, an infinity is the
// minimum or maximum it is, and a norm of large or tiny finite entries stays finite and
// nonzero. Each expected value by hand: sqrt(6) = 2.449, so the norm of six 1e300 is
// 2.449e+300 and of six 1e-310 is 2.449e-310; of [inf, 1] it is inf.
static void test_statistics_are_honest_about_nan_infinity_and_range(void) {
    static const struct {
        double v[6];
        const char *want;
    } cases[] = {
        {{NAN, NAN, NAN, NAN, NAN, NAN},
         "\"min\":\"NaN\",\"max\":\"NaN\",\"norm\":\"NaN\",\"nan\":6,\"inf\":0"},
        {{INFINITY, -INFINITY, INFINITY, -INFINITY, INFINITY, INFINITY},
         "\"min\":\"-Infinity\",\"max\":\"Infinity\",\"norm\":\"Infinity\",\"nan\":0,"
         "\"inf\":6"},
        {{1, INFINITY, 1, 1, 1, 1},
         "\"min\":\"1\",\"max\":\"Infinity\",\"norm\":\"Infinity\",\"nan\":0,\"inf\":1"},
        {{1e300, 1e300, 1e300, 1e300, 1e300, 1e300},
         "\"min\":\"1e+300\",\"max\":\"1e+300\",\"norm\":\"2.449e+300\",\"nan\":0"},
        {{1e-310, 1e-310, 1e-310, 1e-310, 1e-310, 1e-310},
         "\"min\":\"1e-310\",\"max\":\"1e-310\",\"norm\":\"2.449e-310\",\"nan\":0"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ag_tape *tp = ag_tape_new();
        ag_tensor *x = ag_tensor_from(AG_F64, 2, (int[]){2, 3}, cases[c].v);
        ag_tensor_set_requires_grad(x, true);
        ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 1)));
        CHECK(write_page(tp, NULL) == 0);
        if (!strstr(data(), cases[c].want)) fprintf(stderr, "  case %zu: %s\n", c, cases[c].want);
        CHECK(strstr(data(), cases[c].want));
        ag_tape_free(tp);
        ag_tensor_free(x);
    }
}

// An int64 input (a seed, a count) past 2^53 is shown as itself: 2^53 + 1 is
// 9007199254740993, which a double would round to ...992; INT64_MIN in full.
static void test_int64_entries_are_shown_exactly(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("x", 2, 2, 16);
    ag_tensor *big = ag_tensor_from(AG_I64, 1, (int[]){3},
                                    (int64_t[]){(INT64_C(1) << 53) + 1, INT64_MIN, 7});
    ag_tensor *in[] = {x, big};
    static const ag_op carry = {"carry", copy_forward, NULL, NULL};
    ag_op_apply(tp, &carry, 2, in, 2, (int[]){2, 2}, NULL, 0);
    CHECK(write_page(tp, NULL) == 0);
    CHECK(strstr(data(), "\"dtype\":\"i64\",\"shape\":\"[3]\",\"dims\":[3],\"node\":-1,"
                         "\"rg\":false,\"value\":{\"rows\":1,\"cols\":3,\"r\":1,\"c\":3,"
                         "\"full\":true,\"d\":\"9007199254740993 -9223372036854775808 7\","
                         "\"min\":\"-9223372036854775808\",\"max\":\"9007199254740993\""));
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(big);
}

static void test_a_small_tensor_is_in_full_and_a_large_one_cropped_for_a_heatmap(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *small = leaf("small", 4, 4, 4), *wide = leaf("wide", 3, 9, 5);
    ag_tensor *big = leaf("big", 100, 300, 6);
    ag_tensor *a = ag_sum(tp, small), *b = ag_sum(tp, wide), *c = ag_sum(tp, big);
    ag_backward(tp, ag_add(tp, ag_add(tp, a, b), c));
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.max_rows = 10;
    o.max_cols = 20;
    CHECK(write_page(tp, &o) == 0);
    CHECK(strstr(data(), "\"value\":{\"rows\":4,\"cols\":4,\"r\":4,\"c\":4,\"full\":true"));
    // 27 elements, but 9 columns: more than a table can hold across.
    CHECK(strstr(data(), "\"value\":{\"rows\":3,\"cols\":9,\"r\":3,\"c\":9,\"full\":false"));
    CHECK(strstr(data(), "\"value\":{\"rows\":100,\"cols\":300,\"r\":10,\"c\":20,\"full\":false"));
    // The statistics are over all 30000 entries, not the 200 shown.
    double sq = 0;
    for (size_t i = 0; i < big->numel; i++) sq += ag_tensor_item(big, i) * ag_tensor_item(big, i);
    char norm[64];
    snprintf(norm, sizeof norm, "\"norm\":\"%.4g\"", sqrt(sq));
    CHECK(strstr(data(), norm));
    ag_tape_free(tp);
    ag_tensor_free(small), ag_tensor_free(wide), ag_tensor_free(big);
}

// x read twice by one node (x * x) and once more by another: each input slot gets its own
// share, and x's gradient is their sum.
static void test_each_input_gets_what_the_node_sends_it(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 2, (int[]){1, 2}, (double[]){3, -1});
    ag_tensor_set_name(x, "x");
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *squared = ag_mul(tp, x, x), *scaled = ag_scale(tp, x, 5);
    ag_backward(tp, ag_sum(tp, ag_add(tp, squared, scaled)));
    CHECK(write_page(tp, NULL) == 0);
    // mul: each slot gets dy * (the other) = x; scale sends 5; x's gradient 2x + 5.
    CHECK(strstr(data(), "{\"op\":\"mul\",\"rule\":\"da = dy * b; db = dy * a; each summed over "
                         "its broadcast dims\",\"in\":[0,0],\"out\":1,\"sends\":[{\"rows\":1,"
                         "\"cols\":2,\"r\":1,\"c\":2,\"full\":true,\"d\":\"3 -1\""));
    CHECK(strstr(data(), "{\"op\":\"scale\",\"rule\":\"dx = s * dy\",\"in\":[0],\"out\":2,"
                         "\"sends\":[{\"rows\":1,\"cols\":2,\"r\":1,\"c\":2,\"full\":true,"
                         "\"d\":\"5 5\""));
    CHECK(strstr(data(), "\"name\":\"x\",\"dtype\":\"f64\",\"shape\":\"[1,2]\",\"dims\":[1,2],"
                         "\"node\":-1,\"rg\":true,\"value\":{\"rows\":1,\"cols\":2,\"r\":1,\"c\":2,"
                         "\"full\":true,\"d\":\"3 -1\""));
    CHECK(strstr(data(), "\"grad\":{\"rows\":1,\"cols\":2,\"r\":1,\"c\":2,\"full\":true,"
                         "\"d\":\"11 3\""));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_rounding_below_zero_below_is_shown_as_0_and_counted(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){1, 1, 1});
    ag_tensor *w = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){1e-19, 0.5, -3e-13});
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, x, w)));
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.zero_below = 1e-12;
    CHECK(write_page(tp, &o) == 0);
    // The gradient sent to x and x's own: 1e-19 and -3e-13 shown as 0; the values of w,
    // which are no gradient, as they are.
    CHECK(strstr(data(), "\"sends\":[{\"rows\":1,\"cols\":3,\"r\":1,\"c\":3,\"full\":true,"
                         "\"d\":\"0 0.5 0\",\"min\":\"0\",\"max\":\"0.5\",\"norm\":\"0.5\","
                         "\"nan\":0,\"inf\":0,\"zeroed\":2}"));
    CHECK(strstr(data(), "\"d\":\"1e-19 0.5 -3e-13\""));
    CHECK(strstr(data(), "\"zero_below\":\"1e-12\""));
    // The threshold the caption names is the one applied, whatever the digits: at 1 digit
    // 1.5e-12 is not "2e-12" (-3e-13 and 1e-19 are below either).
    o.zero_below = 1.5e-12;
    o.digits = 1;
    CHECK(write_page(tp, &o) == 0);
    CHECK(strstr(data(), "\"zero_below\":\"1.5e-12\""));
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(w);
}

static void test_each_node_shows_its_own_check_when_the_tape_was_checked(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("x", 2, 3, 7);
    ag_backward(tp, ag_sum(tp, ag_softmax(tp, x, NULL)));
    CHECK(write_page(tp, NULL) == 0);
    CHECK(strstr(data(), "\"checked\":false"));
    CHECK(strstr(data(), "\"check\":null"));
    ag_tape_check_report r;
    CHECK(ag_tape_check(tp, NULL, &r));
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.check = &r;
    CHECK(write_page(tp, &o) == 0);
    CHECK(strstr(data(), "\"checked\":true"));
    char want[128];
    snprintf(want, sizeof want, "\"check\":{\"ok\":true,\"n\":%d,\"elem\":true,\"f64\":true,"
                                "\"runs\":%d,", r.nodes[0].fd.comparisons,
             r.nodes[0].fd.forward_runs);
    CHECK(strstr(data(), want));
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// Four identical layers (linear, gelu, linear, add) between an input and a loss: 18 nodes,
// cut into the 4 layers as the model has them (from the first linear, not from the add).
static void test_a_large_tape_collapses_its_repeated_blocks(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("x", 2, 4, 8), *w1 = leaf("w1", 4, 4, 9), *w2 = leaf("w2", 4, 4, 10);
    ag_tensor *h = ag_scale(tp, x, 1);
    for (int l = 0; l < 4; l++) {
        ag_tensor *u = ag_gelu(tp, ag_linear(tp, h, w1, NULL), AG_GELU_ERF);
        h = ag_add(tp, h, ag_linear(tp, u, w2, NULL));
    }
    ag_backward(tp, ag_sum(tp, h));
    CHECK(ag_tape_num_nodes(tp) == 18);
    CHECK(write_page(tp, NULL) == 0);
    CHECK(strstr(data(), "\"groups\":[]"));  // 18 nodes fit
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.max_nodes = 10;
    CHECK(write_page(tp, &o) == 0);
    CHECK(strstr(data(), "\"groups\":[{\"first\":1,\"count\":4,\"copy\":1,\"through\":1,\"copies\":4},"
                         "{\"first\":5,\"count\":4,\"copy\":2,\"through\":2,\"copies\":4},"
                         "{\"first\":9,\"count\":4,\"copy\":3,\"through\":3,\"copies\":4},"
                         "{\"first\":13,\"count\":4,\"copy\":4,\"through\":4,\"copies\":4}]"));
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(w1), ag_tensor_free(w2);
}

// A recurrent step unrolled 1000 times (scale, tanh: 2000 nodes, then the loss): not 1000
// boxes but at most half of max_nodes, 50 steps to a box, and the loss's node beside them.
static void test_a_run_of_very_many_blocks_shows_several_to_a_box(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("h0", 1, 3, 15);
    ag_tensor *h = x;
    for (int i = 0; i < 1000; i++) h = ag_tanh(tp, ag_scale(tp, h, 1.01));
    ag_backward(tp, ag_sum(tp, h));
    CHECK(write_page(tp, NULL) == 0);  // max_nodes 40: 20 boxes of blocks
    CHECK(strstr(data(), "\"groups\":[{\"first\":0,\"count\":100,\"copy\":1,\"through\":50,"
                         "\"copies\":1000},{\"first\":100,\"count\":100,\"copy\":51,"));
    CHECK(strstr(data(), "{\"first\":1900,\"count\":100,\"copy\":951,\"through\":1000,"
                         "\"copies\":1000}]}"));
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.max_nodes = 1;  // one box holds them all
    CHECK(write_page(tp, &o) == 0);
    CHECK(strstr(data(), "\"groups\":[{\"first\":0,\"count\":2000,\"copy\":1,"
                         "\"through\":1000,\"copies\":1000}]}"));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// Nothing repeats: consecutive chunks, each a box, until the boxes fit.
static void test_a_large_tape_without_repeats_is_cut_into_chunks(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("x", 2, 2, 11);
    ag_tensor *h = ag_scale(tp, x, 2);
    h = ag_exp(tp, h), h = ag_tanh(tp, h), h = ag_relu(tp, h), h = ag_gelu(tp, h, AG_GELU_ERF);
    h = ag_sigmoid(tp, h), h = ag_neg(tp, h), h = ag_abs(tp, h);
    ag_backward(tp, ag_sum(tp, h));
    CHECK(ag_tape_num_nodes(tp) == 9);
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.max_nodes = 3;
    CHECK(write_page(tp, &o) == 0);
    CHECK(strstr(data(), "\"groups\":[{\"first\":0,\"count\":3,\"copy\":0,\"through\":0,\"copies\":0},"
                         "{\"first\":3,\"count\":3,\"copy\":0,\"through\":0,\"copies\":0},"
                         "{\"first\":6,\"count\":3,\"copy\":0,\"through\":0,\"copies\":0}]"));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_an_empty_tape_still_makes_a_page(void) {
    ag_tape *tp = ag_tape_new();
    CHECK(write_page(tp, NULL) == 0);
    CHECK(strstr(data(), "\"nodes\":[],\n\"tensors\":[],\n\"groups\":[]}"));
    ag_tape_free(tp);
}

static void test_a_path_that_cannot_be_written_fails_with_one_line(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("x", 1, 2, 12);
    ag_backward(tp, ag_sum(tp, x));
    ag_err err = {{0}};
    CHECK(ag_tape_html(tp, testing_path("no-such-dir/page.html"), NULL, &err) == -1);
    CHECK(strstr(err.msg, "no-such-dir/page.html") && !strchr(err.msg, '\n'));
    CHECK(ag_tape_html(tp, "", NULL, &err) == -1);
    CHECK(strstr(err.msg, "the path is empty"));
    CHECK(ag_tape_html(tp, testing_path("dir/"), NULL, &err) == -1);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A full disk midway: the page that was there stays whole, and no temporary file stays.
static void test_a_failed_write_leaves_the_previous_page(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = leaf("x", 64, 64, 13);
    ag_backward(tp, ag_sum(tp, ag_exp(tp, x)));
    CHECK(write_page(tp, NULL) == 0);
    size_t before_len = page_len;
    char *before = page;
    page = NULL;
    testing_file_size f = testing_file_size_limit(4096);
    ag_err err = {{0}};
    CHECK(ag_tape_html(tp, testing_path("page.html"), NULL, &err) == -1);
    testing_file_size_restore(f);
    CHECK(strstr(err.msg, "page.html") && strstr(err.msg, "left as it was"));
    size_t after_len;
    char *after = (char *)testing_read_file(testing_path("page.html"), &after_len);
    CHECK(after && after_len == before_len && memcmp(after, before, before_len) == 0);
    CHECK(testing_count_files(".tmp.") == 0);
    free(before), free(after);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_options_out_of_range_and_a_report_of_another_tape_are_refused(void) {
    ag_tape *tp = ag_tape_new(), *other = ag_tape_new();
    ag_tensor *x = leaf("x", 1, 2, 14);
    ag_backward(tp, ag_sum(tp, ag_exp(tp, x)));
    ag_sum(other, x);
    ag_tape_check_report r;
    ag_tape_check(other, NULL, &r);
    testing_catch_errors();
    ag_err err;
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.digits = 0;
    CHECK(ag_tape_html(tp, testing_path("bad.html"), &o, &err) == -1);
    // The message names the one option out of range, in err too, and nothing else.
    CHECK(!strcmp(testing_last_error, "tape_html: digits must be 1 to 17, got 0"));
    CHECK(!strcmp(err.msg, "tape_html: digits must be 1 to 17, got 0"));
    o = ag_tape_html_defaults();
    o.max_rows = 0;
    CHECK(ag_tape_html(tp, testing_path("bad.html"), &o, &err) == -1);
    CHECK(!strcmp(err.msg, "tape_html: max_rows must be 1 to 1024, got 0"));
    o = ag_tape_html_defaults();
    o.max_cols = 1025;
    CHECK(ag_tape_html(tp, testing_path("bad.html"), &o, &err) == -1);
    CHECK(!strcmp(err.msg, "tape_html: max_cols must be 1 to 1024, got 1025"));
    o = ag_tape_html_defaults();
    o.zero_below = NAN;
    CHECK(ag_tape_html(tp, testing_path("bad.html"), &o, &err) == -1);
    CHECK(!strcmp(err.msg, "tape_html: zero_below must be finite and >= 0, got nan"));
    o = ag_tape_html_defaults();
    o.n_notes = 2;
    CHECK(ag_tape_html(tp, testing_path("bad.html"), &o, &err) == -1);
    CHECK(strstr(testing_last_error, "tape_html: 2 notes given with notes NULL"));
    o = ag_tape_html_defaults();
    o.check = &r;
    CHECK(ag_tape_html(tp, testing_path("bad.html"), &o, &err) == -1);
    CHECK(strstr(testing_last_error, "the check report has 1 nodes, the tape 2"));
    // A report of another tape with as many nodes (it was taken for this one's, its
    // verdicts shown on nodes it never checked); one of a tape of the same ops and shapes
    // is this tape's check in all it can tell.
    ag_tape *same_count = ag_tape_new(), *same_ops = ag_tape_new();
    ag_sum(same_count, ag_mul(same_count, x, x));
    ag_sum(same_ops, ag_exp(same_ops, x));
    ag_tape_check_report r2, r3;
    ag_tape_check(same_count, NULL, &r2);
    ag_tape_check(same_ops, NULL, &r3);
    o.check = &r2;
    CHECK(ag_tape_html(tp, testing_path("bad.html"), &o, &err) == -1);
    CHECK(!strcmp(err.msg, "tape_html: the check report's node 0 is mul -> [1,2], the tape's "
                           "exp -> [1,2]: a report of another tape"));
    o.check = &r3;
    CHECK(ag_tape_html(tp, testing_path("same.html"), &o, &err) == 0);
    ag_tape_check_report_free(&r2), ag_tape_check_report_free(&r3);
    ag_tape_free(same_count), ag_tape_free(same_ops);
    CHECK(ag_tape_html(NULL, testing_path("bad.html"), NULL, &err) == -1);
    CHECK(strstr(testing_last_error, "tape_html: the tape is NULL"));
    CHECK(testing_error_count == 8);
    testing_release_errors();
    CHECK(testing_count_files("bad.html") == 0);
    ag_tape_check_report_free(&r);
    ag_tape_free(tp), ag_tape_free(other);
    ag_tensor_free(x);
}

int main(void) {
    RUN(test_the_page_is_one_file_that_can_load_nothing);
    RUN(test_names_and_rules_are_text_never_markup);
    RUN(test_a_name_that_is_not_utf8_is_shown_with_replacement_characters);
    RUN(test_a_frozen_tensor_read_twice_is_one_tensor_with_its_note);
    RUN(test_values_and_gradients_have_the_digits_asked_for);
    RUN(test_nan_and_infinities_are_shown_and_counted);
    RUN(test_statistics_are_honest_about_nan_infinity_and_range);
    RUN(test_int64_entries_are_shown_exactly);
    RUN(test_a_small_tensor_is_in_full_and_a_large_one_cropped_for_a_heatmap);
    RUN(test_each_input_gets_what_the_node_sends_it);
    RUN(test_rounding_below_zero_below_is_shown_as_0_and_counted);
    RUN(test_each_node_shows_its_own_check_when_the_tape_was_checked);
    RUN(test_a_large_tape_collapses_its_repeated_blocks);
    RUN(test_a_run_of_very_many_blocks_shows_several_to_a_box);
    RUN(test_a_large_tape_without_repeats_is_cut_into_chunks);
    RUN(test_an_empty_tape_still_makes_a_page);
    RUN(test_a_path_that_cannot_be_written_fails_with_one_line);
    RUN(test_a_failed_write_leaves_the_previous_page);
    RUN(test_options_out_of_range_and_a_report_of_another_tape_are_refused);
    free(page);
    testing_remove_tmpdir();
    return testing_summary();
}
