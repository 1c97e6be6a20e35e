// The attograd-mha program, run as its users run it: on every PyTorch
// reference case in tests/reference/mha (written by tests/pytorch/
// make_mha_reference.py), where every tensor of OUT must match torch's per
// tensor,
//     max |ours - torch| / max |torch| <= 1e-10 (F64 cases), 1e-5 (F32 cases),
// the F32 references being torch's float64 result for the same float32
// inputs; and on bad files, where it must exit with status 2 and one line.
//
// The program's path is compiled in (AG_MHA_TOOL); a path given as the first
// argument replaces it, to test an installed copy.
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "testing.h"
#include "testing_files.h"

#ifndef AG_MHA_TOOL
#error "AG_MHA_TOOL must name the attograd-mha program (tests/CMakeLists.txt sets it)"
#endif

extern char **environ;

#define REF_DIR AG_SOURCE_DIR "/tests/reference/mha"

static const char *tool = AG_MHA_TOOL;

// ---- Running the program -------------------------------------------------------------

typedef struct tool_run {
    int status;      // the exit status, or 128 + the signal that ended it
    char out[8192];  // what it printed on stdout
    char err[8192];  // ... and on stderr
} tool_run;

static void read_text(const char *path, char *buf, size_t size) {
    size_t n = 0;
    unsigned char *data = testing_read_file(path, &n);
    if (n >= size) n = size - 1;
    if (data) memcpy(buf, data, n);
    buf[n] = 0;
    free(data);
}

// Runs the program with `args` (NULL-terminated), capturing its output.
static tool_run run_tool(const char *const args[]) {
    static tool_run r;
    memset(&r, 0, sizeof r);
    char *argv[8] = {(char *)tool};
    for (int i = 0; args[i] && i < 6; i++) argv[i + 1] = (char *)args[i];
    char out_path[640], err_path[640];
    snprintf(out_path, sizeof out_path, "%s", testing_path("tool.stdout"));
    snprintf(err_path, sizeof err_path, "%s", testing_path("tool.stderr"));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int status = 0;
    if (posix_spawn(&pid, tool, &fa, NULL, argv, environ) != 0 || waitpid(pid, &status, 0) != pid) {
        fprintf(stderr, "cannot run %s\n", tool);
        r.status = -1;
    } else {
        r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    posix_spawn_file_actions_destroy(&fa);
    read_text(out_path, r.out, sizeof r.out);
    read_text(err_path, r.err, sizeof r.err);
    return r;
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

// ---- Comparing with PyTorch ---------------------------------------------------------------

// max |ours - ref| / max |ref|; infinite for a NaN or an infinity that differs.
static double rel_err(const ag_tensor *ours, const ag_tensor *ref) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < ref->numel; i++) {
        double o = ag_tensor_item(ours, i), r = ag_tensor_item(ref, i);
        if (isnan(o) || isnan(r) || isinf(o) || isinf(r)) {
            if (!(o == r)) diff = INFINITY;
            continue;
        }
        diff = fmax(diff, fabs(o - r));
        scale = fmax(scale, fabs(r));
    }
    return scale > 0 ? diff / scale : diff;
}

// Checks that `ours` holds exactly the tensors of `ref`, with the same dtypes
// and shapes and values within `tol`; returns the worst relative error.
static double compare_sets(const char *what, const ag_safetensors *ours,
                           const ag_safetensors *ref, double tol) {
    double worst = 0;
    CHECK(ag_safetensors_count(ours) == ag_safetensors_count(ref));
    for (int i = 0; i < ag_safetensors_count(ref); i++) {
        const char *name = ag_safetensors_name(ref, i);
        const ag_tensor *r = ag_safetensors_at(ref, i), *o = ag_safetensors_find(ours, name);
        if (!o || o->dtype != r->dtype || !ag_tensor_same_shape(o, r)) {
            fprintf(stderr, "  %s: %s is %s\n", what, name,
                    o ? "of another dtype or shape" : "missing");
            CHECK(!"OUT has the reference's tensors");
            continue;
        }
        double e = rel_err(o, r);
        worst = fmax(worst, e);
        if (!(e <= tol)) {
            fprintf(stderr, "  %s: %s differs from PyTorch by %.3e (tol %.0e)\n", what, name, e,
                    tol);
            CHECK(!"matches PyTorch");
        }
    }
    return worst;
}

static ag_safetensors *load(const char *path) {
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    if (!st) fprintf(stderr, "  %s\n", err.msg);
    CHECK(st != NULL);
    return st;
}

// Runs the program on reference case `name` and compares OUT with torch's.
static double check_case(const char *name, double tol) {
    char in[640], ref[640], out[640];
    snprintf(in, sizeof in, "%s/%s.in.safetensors", REF_DIR, name);
    snprintf(ref, sizeof ref, "%s/%s.out.safetensors", REF_DIR, name);
    snprintf(out, sizeof out, "%s", testing_path("case.out.safetensors"));
    tool_run r = run_tool((const char *[]){in, out, NULL});
    if (r.status != 0) fprintf(stderr, "  %s: exit %d: %s", name, r.status, r.err);
    CHECK(r.status == 0);
    CHECK(r.out[0] == 0 && r.err[0] == 0);  // success is silent
    ag_safetensors *o = r.status == 0 ? load(out) : NULL, *t = load(ref);
    double worst = o && t ? compare_sets(name, o, t, tol) : INFINITY;
    ag_safetensors_free(o);
    ag_safetensors_free(t);
    unlink(out);
    return worst;
}

// Every configuration make_mha_reference.py writes; a missing file fails.
static const char *const cases[] = {
    "self_packed_f64", "self_packed_f32", "cross_f64", "cross_f32", "kdim_vdim_f64",
    "kdim_vdim_f32", "no_bias_f64", "no_bias_kdim_f64", "one_head_f64", "one_query_f64",
    "head_dim_3_f64", "head_dim_10_f64", "larger_f64", "key_padding_bool_f64",
    "key_padding_u8_f64", "attn_mask_bool_f64", "attn_mask_u8_f64", "attn_mask_float_f64",
    "attn_mask_bool_3d_f64", "attn_mask_float_3d_f64", "causal_f64", "causal_f32",
    "causal_cross_f64", "combined_f64", "combined_f32", "combined_packed_f64",
    "bias_kv_f64", "bias_kv_f32", "zero_attn_f64", "bias_kv_zero_attn_causal_f64",
    "bias_kv_zero_attn_combined_f64", "bias_kv_zero_attn_combined_f32"};
enum { N_CASES = sizeof cases / sizeof *cases };

static bool is_f32_case(const char *name) {
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, "_f32") == 0;
}

static void run_cases(bool f32) {
    double tol = f32 ? 1e-5 : 1e-10, worst = 0;
    int n = 0;
    for (int i = 0; i < N_CASES; i++) {
        if (is_f32_case(cases[i]) != f32) continue;
        double e = check_case(cases[i], tol);
        fprintf(stderr, "     %-24s worst relative error %.2e\n", cases[i], e);
        worst = fmax(worst, e);
        n++;
    }
    fprintf(stderr, "     %d %s cases, worst %.2e (tolerance %.0e)\n", n, f32 ? "F32" : "F64",
            worst, tol);
}

static void test_reference_has_every_case(void) {
    for (int i = 0; i < N_CASES; i++) {
        char path[640];
        for (int k = 0; k < 2; k++) {
            snprintf(path, sizeof path, "%s/%s.%s.safetensors", REF_DIR, cases[i],
                     k ? "out" : "in");
            if (!exists(path)) fprintf(stderr, "  no %s\n", path);
            CHECK(exists(path));
        }
    }
}

static void test_every_f64_case_matches_pytorch_to_1e_10(void) { run_cases(false); }

static void test_every_f32_case_matches_pytorch_to_1e_5(void) { run_cases(true); }

// ---- Files made here ------------------------------------------------------------------------

// An IN file being put together: named heap tensors and metadata.
typedef struct in_file {
    const char *names[16];
    ag_tensor *tensors[16];
    int n;
    const char *meta[4][2];
    int n_meta;
} in_file;

static void put(in_file *f, const char *name, ag_tensor *t) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            ag_tensor_free(f->tensors[i]);
            f->tensors[i] = t;
            return;
        }
    f->names[f->n] = name;
    f->tensors[f->n++] = t;
}

static void drop(in_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            ag_tensor_free(f->tensors[i]);
            f->names[i] = f->names[--f->n];
            f->tensors[i] = f->tensors[f->n];
            return;
        }
}

static ag_tensor *tensor_of(const in_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) return f->tensors[i];
    return NULL;
}

// Sets metadata `key` (value NULL removes it).
static void meta(in_file *f, const char *key, const char *value) {
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[i][0], key)) {
            if (value) {
                f->meta[i][1] = value;
            } else {
                f->meta[i][0] = f->meta[--f->n_meta][0];
                f->meta[i][1] = f->meta[f->n_meta][1];
            }
            return;
        }
    if (value) {
        f->meta[f->n_meta][0] = key;
        f->meta[f->n_meta++][1] = value;
    }
}

static ag_tensor *random_tensor(ag_dtype dt, int ndim, const int shape[], ag_pcg32 *rng) {
    return ag_tensor_uniform(dt, ndim, shape, rng, -1, 1);
}

// A valid IN: B = 2, T = 3, S = 5, E = 8, 2 heads, packed projections, biases.
static in_file valid_in(ag_dtype dt) {
    in_file f = {0};
    ag_pcg32 rng = ag_pcg32_make(7, 7);
    put(&f, "query", random_tensor(dt, 3, (int[]){2, 3, 8}, &rng));
    put(&f, "key", random_tensor(dt, 3, (int[]){2, 5, 8}, &rng));
    put(&f, "value", random_tensor(dt, 3, (int[]){2, 5, 8}, &rng));
    put(&f, "grad_output", random_tensor(dt, 3, (int[]){2, 3, 8}, &rng));
    put(&f, "in_proj_weight", random_tensor(dt, 2, (int[]){24, 8}, &rng));
    put(&f, "in_proj_bias", random_tensor(dt, 1, (int[]){24}, &rng));
    put(&f, "out_proj.weight", random_tensor(dt, 2, (int[]){8, 8}, &rng));
    put(&f, "out_proj.bias", random_tensor(dt, 1, (int[]){8}, &rng));
    meta(&f, "num_heads", "2");
    return f;
}

static void free_in(in_file *f) {
    for (int i = 0; i < f->n; i++) ag_tensor_free(f->tensors[i]);
    f->n = 0;
}

static const char *write_in(const in_file *f, const char *file) {
    static char path[640];
    snprintf(path, sizeof path, "%s", testing_path(file));
    ag_safetensors *st = ag_safetensors_new();
    ag_err err;
    for (int i = 0; i < f->n; i++) CHECK(ag_safetensors_add(st, f->names[i], f->tensors[i], &err) == 0);
    for (int i = 0; i < f->n_meta; i++)
        CHECK(ag_safetensors_set_meta(st, f->meta[i][0], f->meta[i][1], &err) == 0);
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    ag_safetensors_free(st);
    return path;
}

// Runs the program on `in_path` and checks that it fails as it should: exit
// status 2, exactly "attograd-mha: <line>\n" on stderr, nothing on stdout,
// and no OUT.
static void check_fails_on(const char *in_path, const char *line) {
    char out[640], want[1200];
    snprintf(out, sizeof out, "%s", testing_path("bad.out.safetensors"));
    unlink(out);
    tool_run r = run_tool((const char *[]){in_path, out, NULL});
    snprintf(want, sizeof want, "attograd-mha: %s\n", line);
    if (r.status != 2 || strcmp(r.err, want) != 0)
        fprintf(stderr, "  exit %d, stderr: %s  expected exit 2, stderr: %s", r.status, r.err, want);
    CHECK(r.status == 2);
    CHECK(strcmp(r.err, want) == 0);
    CHECK(r.out[0] == 0);
    CHECK(!exists(out));
}

static void check_fails(const in_file *f, const char *line) {
    check_fails_on(write_in(f, "bad.in.safetensors"), line);
}

// ---- Semantics ----------------------------------------------------------------------------------

static ag_safetensors *run_on(const in_file *f) {
    const char *in = write_in(f, "made.in.safetensors");
    char out[640];
    snprintf(out, sizeof out, "%s", testing_path("made.out.safetensors"));
    tool_run r = run_tool((const char *[]){in, out, NULL});
    if (r.status) fprintf(stderr, "  exit %d: %s", r.status, r.err);
    CHECK(r.status == 0);
    return r.status == 0 ? load(out) : NULL;
}

static double value_at(const ag_safetensors *st, const char *name, size_t i) {
    const ag_tensor *t = ag_safetensors_find(st, name);
    return t ? ag_tensor_item(t, i) : NAN;
}

static bool all_finite(const ag_safetensors *st) {
    for (int i = 0; i < ag_safetensors_count(st); i++) {
        const ag_tensor *t = ag_safetensors_at(st, i);
        for (size_t e = 0; e < t->numel; e++)
            if (!isfinite(ag_tensor_item(t, e))) return false;
    }
    return true;
}

// Batch 1 pads every key; attn_mask masks every key of query 1. Those
// queries attend to nothing: zero weights, output = out_proj.bias, and no
// gradient through them; nothing is NaN.
static void test_fully_masked_query_gets_zero_weights_and_the_output_bias(void) {
    in_file f = valid_in(AG_F64);
    put(&f, "key_padding_mask",
        ag_tensor_from(AG_BOOL, 2, (int[]){2, 5}, (uint8_t[]){0, 1, 0, 0, 1, 1, 1, 1, 1, 1}));
    uint8_t mask[3 * 5] = {0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1};
    put(&f, "attn_mask", ag_tensor_from(AG_BOOL, 2, (int[]){3, 5}, mask));
    ag_safetensors *out = run_on(&f);
    if (!out) {
        free_in(&f);
        return;
    }
    CHECK(all_finite(out));
    const ag_tensor *bias = tensor_of(&f, "out_proj.bias");
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 3; t++) {
            bool empty = b == 1 || t == 1;
            double sum = 0;
            for (int s = 0; s < 5; s++) sum += value_at(out, "attn_weights", (size_t)(b * 3 + t) * 5 + s);
            CHECK_NEAR(sum, empty ? 0.0 : 1.0, 1e-14);
            if (!empty) continue;
            for (int e = 0; e < 8; e++)
                CHECK(value_at(out, "output", (size_t)(b * 3 + t) * 8 + e) == ag_tensor_item(bias, (size_t)e));
        }
    // Nothing attends to batch 1's keys and values: their gradients are zero.
    for (size_t i = 5 * 8; i < 2 * 5 * 8; i++) {
        CHECK(value_at(out, "grad.key", i) == 0.0);
        CHECK(value_at(out, "grad.value", i) == 0.0);
    }
    ag_safetensors_free(out);
    free_in(&f);
}

// A copy of reference case `name`'s IN as an in_file.
static in_file reference_in(const char *name) {
    char path[640];
    snprintf(path, sizeof path, "%s/%s.in.safetensors", REF_DIR, name);
    in_file f = {0};
    ag_safetensors *st = load(path);
    for (int i = 0; st && i < ag_safetensors_count(st); i++) {
        const ag_tensor *t = ag_safetensors_at(st, i);
        // The names live in a static table so they outlive the set.
        static const char *const known[] = {"query", "key", "value", "grad_output",
                                            "key_padding_mask", "attn_mask", "in_proj_weight",
                                            "q_proj_weight", "k_proj_weight", "v_proj_weight",
                                            "in_proj_bias", "out_proj.weight", "out_proj.bias"};
        for (size_t k = 0; k < sizeof known / sizeof *known; k++)
            if (!strcmp(known[k], ag_safetensors_name(st, i)))
                put(&f, known[k], ag_tensor_convert(t, t->dtype));
    }
    static char heads[16];
    snprintf(heads, sizeof heads, "%s", st ? ag_safetensors_meta(st, "num_heads") : "1");
    meta(&f, "num_heads", heads);
    ag_safetensors_free(st);
    return f;
}

// Rows [i*E, (i+1)*E) of an [3E, E] tensor.
static ag_tensor *rows(const ag_tensor *t, int i, int E) {
    ag_tensor *r = ag_tensor_zeros(t->dtype, 2, (int[]){E, E});
    for (size_t e = 0; e < r->numel; e++) ag_tensor_set_item(r, e, ag_tensor_item(t, (size_t)i * E * E + e));
    return r;
}

// q/k/v_proj_weight with kdim = vdim = E (PyTorch would pack them) give
// what in_proj_weight gives, with the gradient split the same way.
static void test_separate_projections_of_equal_width_act_as_the_packed_one(void) {
    in_file f = reference_in("self_packed_f64");
    ag_tensor *packed = ag_tensor_convert(tensor_of(&f, "in_proj_weight"), AG_F64);
    int E = packed->shape[1];
    drop(&f, "in_proj_weight");
    put(&f, "q_proj_weight", rows(packed, 0, E));
    put(&f, "k_proj_weight", rows(packed, 1, E));
    put(&f, "v_proj_weight", rows(packed, 2, E));
    ag_safetensors *out = run_on(&f);
    ag_safetensors *ref = load(REF_DIR "/self_packed_f64.out.safetensors");
    const char *same[] = {"output", "attn_weights", "grad.query", "grad.key", "grad.value",
                          "grad.in_proj_bias", "grad.out_proj.weight", "grad.out_proj.bias"};
    const char *split[] = {"grad.q_proj_weight", "grad.k_proj_weight", "grad.v_proj_weight"};
    if (out && ref) {
        CHECK(ag_safetensors_count(out) == 11 && !ag_safetensors_find(out, "grad.in_proj_weight"));
        for (size_t i = 0; i < sizeof same / sizeof *same; i++)
            CHECK(rel_err(ag_safetensors_find(out, same[i]), ag_safetensors_find(ref, same[i])) <= 1e-10);
        for (int i = 0; i < 3; i++) {
            ag_tensor *want = rows(ag_safetensors_find(ref, "grad.in_proj_weight"), i, E);
            const ag_tensor *got = ag_safetensors_find(out, split[i]);
            CHECK(got && ag_tensor_same_shape(got, want) && rel_err(got, want) <= 1e-10);
            ag_tensor_free(want);
        }
    }
    ag_safetensors_free(out);
    ag_safetensors_free(ref);
    ag_tensor_free(packed);
    free_in(&f);
}

// query, key and value are separate leaves. One tensor x used as all three
// (self-attention, as PyTorch's mha(x, x, x)) gets the sum of the three
// gradients, which the library computes directly.
static void test_gradients_are_per_input_and_sum_to_the_shared_tensors(void) {
    in_file f = valid_in(AG_F64);
    put(&f, "key", ag_tensor_convert(tensor_of(&f, "query"), AG_F64));
    put(&f, "value", ag_tensor_convert(tensor_of(&f, "query"), AG_F64));
    ag_safetensors *out = run_on(&f);
    if (!out) {
        free_in(&f);
        return;
    }
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2};
    CHECK(ag_mha_init(&m, ps, "", &cfg, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_copy(ag_params_at(ps, i), tensor_of(&f, ag_params_at(ps, i)->name));
    ag_tensor *x = ag_tensor_convert(tensor_of(&f, "query"), AG_F64);
    ag_tensor_set_requires_grad(x, true);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_mha_forward(tp, &m, x, x, x, NULL, NULL);
    ag_backward_with(tp, y, tensor_of(&f, "grad_output"));
    double worst = 0, scale = 0;
    for (size_t i = 0; i < x->numel; i++) {
        double sum = value_at(out, "grad.query", i) + value_at(out, "grad.key", i) +
                     value_at(out, "grad.value", i);
        worst = fmax(worst, fabs(sum - ag_tensor_grad_item(x, i)));
        scale = fmax(scale, fabs(ag_tensor_grad_item(x, i)));
    }
    CHECK(scale > 0 && worst <= 1e-13 * scale);
    // and each part on its own is not the whole
    CHECK(fabs(value_at(out, "grad.key", 0) - ag_tensor_grad_item(x, 0)) > 1e-6);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(ps);
    ag_safetensors_free(out);
    free_in(&f);
}

// U8 masks mean what BOOL masks mean, with any nonzero byte as true.
static void test_u8_masks_act_as_bool_with_nonzero_as_true(void) {
    in_file f = valid_in(AG_F32);
    uint8_t kpm[10] = {0, 1, 0, 0, 0, 0, 0, 1, 1, 0}, mask[15] = {0, 1, 0, 0, 0, 0, 0, 0, 0, 1,
                                                              0, 0, 1, 1, 0};
    put(&f, "key_padding_mask", ag_tensor_from(AG_BOOL, 2, (int[]){2, 5}, kpm));
    put(&f, "attn_mask", ag_tensor_from(AG_BOOL, 2, (int[]){3, 5}, mask));
    ag_safetensors *as_bool = run_on(&f);
    for (int i = 0; i < 10; i++) kpm[i] *= (uint8_t)(i % 2 ? 255 : 3);
    for (int i = 0; i < 15; i++) mask[i] *= (uint8_t)(i % 2 ? 2 : 128);
    put(&f, "key_padding_mask", ag_tensor_from(AG_U8, 2, (int[]){2, 5}, kpm));
    put(&f, "attn_mask", ag_tensor_from(AG_U8, 2, (int[]){3, 5}, mask));
    ag_safetensors *as_u8 = run_on(&f);
    if (as_bool && as_u8) CHECK(compare_sets("u8 vs bool", as_u8, as_bool, 0.0) == 0.0);
    ag_safetensors_free(as_bool);
    ag_safetensors_free(as_u8);
    free_in(&f);
}

// causal "1" is the bool mask triu(ones(T, S), 1); "0" is no mask.
static void test_causal_is_the_upper_triangle_and_zero_is_off(void) {
    in_file f = valid_in(AG_F64);
    meta(&f, "causal", "1");
    ag_safetensors *causal = run_on(&f);
    meta(&f, "causal", NULL);
    uint8_t tri[15];
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 5; s++) tri[t * 5 + s] = s > t;
    put(&f, "attn_mask", ag_tensor_from(AG_BOOL, 2, (int[]){3, 5}, tri));
    ag_safetensors *masked = run_on(&f);
    drop(&f, "attn_mask");
    meta(&f, "causal", "0");
    ag_safetensors *off = run_on(&f);
    meta(&f, "causal", NULL);
    ag_safetensors *plain = run_on(&f);
    if (causal && masked) CHECK(compare_sets("causal vs mask", causal, masked, 0.0) == 0.0);
    if (off && plain) CHECK(compare_sets("causal 0 vs none", off, plain, 0.0) == 0.0);
    if (causal && plain) CHECK(value_at(causal, "attn_weights", 1) == 0.0);  // query 0, key 1
    if (plain) CHECK(value_at(plain, "attn_weights", 1) > 0.0);
    ag_safetensors_free(causal);
    ag_safetensors_free(masked);
    ag_safetensors_free(off);
    ag_safetensors_free(plain);
    free_in(&f);
}

// ---- Bad files -------------------------------------------------------------------------------------

static void test_a_missing_tensor_is_named(void) {
    in_file f = valid_in(AG_F64);
    drop(&f, "value");
    check_fails(&f, "missing tensor 'value' [B,S,vdim]");
    free_in(&f);
    f = valid_in(AG_F64);
    drop(&f, "grad_output");
    check_fails(&f, "missing tensor 'grad_output' [B,T,E]");
    drop(&f, "out_proj.weight");
    put(&f, "grad_output", ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 8}));
    check_fails(&f, "missing tensor 'out_proj.weight' [E,E]");
    free_in(&f);
    f = valid_in(AG_F64);
    drop(&f, "in_proj_weight");
    check_fails(&f, "missing tensor 'in_proj_weight' [3E,E] (or q_proj_weight, k_proj_weight "
                    "and v_proj_weight)");
    put(&f, "q_proj_weight", ag_tensor_zeros(AG_F64, 2, (int[]){8, 8}));
    put(&f, "k_proj_weight", ag_tensor_zeros(AG_F64, 2, (int[]){8, 8}));
    check_fails(&f, "missing tensor 'v_proj_weight' [E,vdim]: separate projections need "
                    "q_proj_weight, k_proj_weight and v_proj_weight");
    free_in(&f);
}

static void test_half_the_biases_or_both_projection_forms_are_refused(void) {
    in_file f = valid_in(AG_F64);
    drop(&f, "out_proj.bias");
    check_fails(&f, "in_proj_bias is given but out_proj.bias is not: PyTorch's bias=False drops "
                    "both");
    free_in(&f);
    f = valid_in(AG_F64);
    put(&f, "k_proj_weight", ag_tensor_zeros(AG_F64, 2, (int[]){8, 8}));
    check_fails(&f, "in_proj_weight and k_proj_weight are both given: use the packed or the "
                    "separate projections, not both");
    free_in(&f);
}

static void test_an_unexpected_tensor_or_metadata_is_named(void) {
    in_file f = valid_in(AG_F64);
    put(&f, "queries", ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 8}));
    check_fails(&f, "unexpected tensor 'queries'");
    drop(&f, "queries");
    put(&f, "bias_k", ag_tensor_zeros(AG_F64, 3, (int[]){1, 1, 8}));
    check_fails(&f, "bias_k is given but bias_v is not: PyTorch's add_bias_kv makes both");
    put(&f, "bias_v", ag_tensor_zeros(AG_F64, 3, (int[]){1, 8, 1}));
    check_fails(&f, "bias_v [1,8,1] must be [1,1,E] = [1,1,8] (E from query [2,3,8])");
    drop(&f, "bias_v");
    drop(&f, "bias_k");
    meta(&f, "add_zero_attn", "yes");
    check_fails(&f, "metadata add_zero_attn 'yes' must be '0' or '1'");
    meta(&f, "add_zero_attn", NULL);
    put(&f, "self_attn.out_proj.bias", ag_tensor_zeros(AG_F64, 1, (int[]){8}));
    check_fails(&f, "unexpected tensor 'self_attn.out_proj.bias' (names carry no module prefix: "
                    "'out_proj.bias')");
    drop(&f, "self_attn.out_proj.bias");
    meta(&f, "is_causal", "1");
    check_fails(&f, "unexpected metadata 'is_causal' (known: num_heads, causal, add_zero_attn, "
                    "format)");
    meta(&f, "is_causal", NULL);
    meta(&f, "format", "pt");  // what safetensors.torch.save_file writes: fine
    ag_safetensors *ok = run_on(&f);
    CHECK(ok != NULL);
    ag_safetensors_free(ok);
    free_in(&f);
}

static void test_inconsistent_shapes_are_named(void) {
    struct {
        const char *name;
        int ndim, shape[3];
        const char *line;
    } bad[] = {
        {"value", 3, {2, 6, 8}, "key [2,5,8] and value [2,6,8] must have the same batch and length"},
        {"key", 3, {3, 5, 8}, "key [3,5,8] and value [2,5,8] must have the same batch and length"},
        {"query", 3, {1, 3, 8}, "query [1,3,8] and key [2,5,8] must have the same batch"},
        {"query", 2, {3, 8}, "query [3,8] must be [B,T,E] (3-D, batch first)"},
        {"grad_output", 3, {2, 3, 7},
         "grad_output [2,3,7] must be [B,T,E] = [2,3,8] (the output's shape, from query)"},
        {"in_proj_weight", 2, {24, 7},
         "in_proj_weight [24,7] must be [3*E,E] = [24,8] (E from query [2,3,8])"},
        {"key", 3, {2, 5, 6},
         "key [2,5,6] has kdim 6, not embed_dim 8: in_proj_weight needs kdim = vdim = embed_dim "
         "(give q_proj_weight, k_proj_weight and v_proj_weight instead)"},
        {"in_proj_bias", 1, {16}, "in_proj_bias [16] must be [3*E] = [24] (E from query [2,3,8])"},
        {"out_proj.weight", 2, {8, 4},
         "out_proj.weight [8,4] must be [E,E] = [8,8] (E from query [2,3,8])"},
        {"out_proj.bias", 2, {1, 8},
         "out_proj.bias [1,8] must be [E] = [8] (E from query [2,3,8])"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        in_file f = valid_in(AG_F64);
        put(&f, bad[i].name, ag_tensor_zeros(AG_F64, bad[i].ndim, bad[i].shape));
        check_fails(&f, bad[i].line);
        free_in(&f);
    }
}

static void test_an_attention_matrix_too_large_to_allocate_is_refused(void) {
    // Small tensors (1.3 MB each) that would need a 2 x 2 x 12000 x 12000
    // weights matrix: an error line, not an out-of-memory abort.
    in_file f = valid_in(AG_F64);
    put(&f, "query", ag_tensor_zeros(AG_F64, 3, (int[]){2, 12000, 8}));
    put(&f, "key", ag_tensor_zeros(AG_F64, 3, (int[]){2, 12000, 8}));
    put(&f, "value", ag_tensor_zeros(AG_F64, 3, (int[]){2, 12000, 8}));
    put(&f, "grad_output", ag_tensor_zeros(AG_F64, 3, (int[]){2, 12000, 8}));
    check_fails(&f, "query [2,12000,8] and key [2,12000,8] with num_heads 2 need a 5.76e+08-element "
                    "attention matrix; this tool handles at most 2.68e+08");
    free_in(&f);
}

static void test_inconsistent_masks_and_separate_projections_are_named(void) {
    in_file f = valid_in(AG_F64);
    put(&f, "key_padding_mask", ag_tensor_zeros(AG_BOOL, 2, (int[]){2, 4}));
    check_fails(&f, "key_padding_mask [2,4] must be [B,S] = [2,5] (B and S from key [2,5,8])");
    drop(&f, "key_padding_mask");
    put(&f, "attn_mask", ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 5}));
    check_fails(&f, "attn_mask [2,3,5] must be [T,S] = [3,5] or [B*num_heads,T,S] = [4,3,5] "
                    "(from query [2,3,8], key [2,5,8], num_heads 2)");
    drop(&f, "attn_mask");
    drop(&f, "in_proj_weight");
    put(&f, "key", ag_tensor_zeros(AG_F64, 3, (int[]){2, 5, 6}));
    put(&f, "q_proj_weight", ag_tensor_zeros(AG_F64, 2, (int[]){8, 8}));
    put(&f, "k_proj_weight", ag_tensor_zeros(AG_F64, 2, (int[]){8, 8}));
    put(&f, "v_proj_weight", ag_tensor_zeros(AG_F64, 2, (int[]){8, 8}));
    check_fails(&f, "k_proj_weight [8,8] must be [E,kdim] = [8,6] (E from query [2,3,8], kdim "
                    "from key [2,5,6])");
    free_in(&f);
}

static void test_a_bad_num_heads_or_causal_is_refused(void) {
    in_file f = valid_in(AG_F64);
    meta(&f, "num_heads", NULL);
    check_fails(&f, "metadata num_heads is missing (the number of attention heads)");
    const char *bad[] = {"0", "-2", "two", "2 ", "+2", "", "99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char line[128];
        snprintf(line, sizeof line, "metadata num_heads '%s' must be a positive integer", bad[i]);
        meta(&f, "num_heads", bad[i]);
        check_fails(&f, line);
    }
    meta(&f, "num_heads", "3");
    check_fails(&f, "num_heads 3 does not divide embed_dim 8 (query [2,3,8])");
    meta(&f, "num_heads", "2");
    meta(&f, "causal", "yes");
    check_fails(&f, "metadata causal 'yes' must be '0' or '1'");
    free_in(&f);
}

static void test_mixed_or_wrong_dtypes_are_named(void) {
    in_file f = valid_in(AG_F64);
    put(&f, "value", ag_tensor_zeros(AG_F32, 3, (int[]){2, 5, 8}));
    put(&f, "out_proj.bias", ag_tensor_zeros(AG_F32, 1, (int[]){8}));
    check_fails(&f, "mixed float dtypes (F64: query, key, grad_output, in_proj_weight, "
                    "in_proj_bias, out_proj.weight; F32: value, out_proj.bias): every float "
                    "tensor must be F64, or every one F32");
    free_in(&f);
    f = valid_in(AG_F32);
    put(&f, "attn_mask", ag_tensor_zeros(AG_F64, 2, (int[]){3, 5}));
    check_fails(&f, "mixed float dtypes (F64: attn_mask; F32: query, key, value, grad_output, "
                    "in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias): every float "
                    "tensor must be F64, or every one F32");
    put(&f, "attn_mask", ag_tensor_zeros(AG_I32, 2, (int[]){3, 5}));
    check_fails(&f, "attn_mask is I32; it must be BOOL or U8 (true = masked), or F32 or F64 "
                    "(added to the scores)");
    drop(&f, "attn_mask");
    put(&f, "key_padding_mask", ag_tensor_zeros(AG_F32, 2, (int[]){2, 5}));
    check_fails(&f, "key_padding_mask is F32; it must be BOOL or U8 (true = padding)");
    drop(&f, "key_padding_mask");
    put(&f, "query", ag_tensor_zeros(AG_I64, 3, (int[]){2, 3, 8}));
    check_fails(&f, "query is I64; it must be F32 or F64");
    free_in(&f);
}

// A cut file fails as the reader reports it, behind the program's name.
static void test_a_truncated_or_missing_file_is_one_line(void) {
    in_file f = valid_in(AG_F64);
    char in[640], out[640], line[1024];
    snprintf(in, sizeof in, "%s", write_in(&f, "cut.safetensors"));
    snprintf(out, sizeof out, "%s", testing_path("cut.out.safetensors"));
    size_t n;
    unsigned char *bytes = testing_read_file(in, &n);

    testing_write_file(in, bytes, n - 100);  // the data ends early
    tool_run r = run_tool((const char *[]){in, out, NULL});
    snprintf(line, sizeof line, "attograd-mha: %s: tensor '", in);
    CHECK(r.status == 2 && strncmp(r.err, line, strlen(line)) == 0);
    CHECK(strstr(r.err, "reach past the end of the data") && strstr(r.err, "truncated file?)\n"));
    CHECK(strchr(r.err, '\n') == r.err + strlen(r.err) - 1);  // one line
    CHECK(!exists(out));

    testing_write_file(in, bytes, 300);  // inside the header
    size_t header = (size_t)bytes[0] | (size_t)bytes[1] << 8;
    snprintf(line, sizeof line,
             "%s: header length %zu exceeds the 292 bytes after it (truncated file?)", in, header);
    check_fails_on(in, line);
    free(bytes);

    snprintf(in, sizeof in, "%s", testing_path("absent.safetensors"));
    snprintf(line, sizeof line, "%s: cannot open: No such file or directory", in);
    check_fails_on(in, line);
    free_in(&f);
}

static void test_a_failed_write_exits_2_and_leaves_out_as_it_was(void) {
    in_file f = valid_in(AG_F64);
    const char *in = write_in(&f, "good.in.safetensors");
    char in_copy[640], out[640];
    snprintf(in_copy, sizeof in_copy, "%s", in);
    // OUT is a directory: refused before the run (it was found out by the rename, after
    // the run and the write), and the directory stays.
    snprintf(out, sizeof out, "%s", testing_path("outdir"));
    mkdir(out, 0700);
    tool_run r = run_tool((const char *[]){"-v", in_copy, out, NULL});
    CHECK(r.status == 2);
    CHECK(strncmp(r.err, "attograd-mha: ", 14) == 0 &&
          strstr(r.err, "outdir: is a directory, not a regular file; name a file to write\n"));
    CHECK(strchr(r.err, '\n') == r.err + strlen(r.err) - 1);
    struct stat sb;
    CHECK(stat(out, &sb) == 0 && S_ISDIR(sb.st_mode));
    CHECK(testing_count_files(".tmp.") == 0);
    rmdir(out);
    // OUT in a directory that does not exist: refused before IN is read (the run was
    // computed in full, and only then its temporary file could not be made), so a missing
    // IN beside it is not what is reported.
    snprintf(out, sizeof out, "%s/no/such/dir/out.safetensors", testing_tmpdir());
    char want[1600], absent[640];
    snprintf(want, sizeof want, "attograd-mha: %s: the directory %s/no/such/dir: No such "
             "file or directory\n", out, testing_tmpdir());
    r = run_tool((const char *[]){in_copy, out, NULL});
    CHECK(r.status == 2 && strcmp(r.err, want) == 0);
    snprintf(absent, sizeof absent, "%s", testing_path("absent.in.safetensors"));
    r = run_tool((const char *[]){absent, out, NULL});
    CHECK(r.status == 2 && strcmp(r.err, want) == 0);
    // A bad IN leaves an existing OUT untouched.
    snprintf(out, sizeof out, "%s", testing_path("kept.safetensors"));
    testing_write_file(out, "previous", 8);
    drop(&f, "query");
    const char *bad = write_in(&f, "bad.in.safetensors");
    r = run_tool((const char *[]){bad, out, NULL});
    CHECK(r.status == 2);
    size_t n;
    unsigned char *kept = testing_read_file(out, &n);
    CHECK(n == 8 && kept && memcmp(kept, "previous", 8) == 0);
    free(kept);
    free_in(&f);
}

// ---- Usage --------------------------------------------------------------------------------------

static void test_usage_help_and_verbose(void) {
    tool_run r = run_tool((const char *[]){NULL});
    CHECK(r.status == 2 && strncmp(r.err, "usage: attograd-mha ", 20) == 0 && !r.out[0]);
    r = run_tool((const char *[]){"a", "b", "c", NULL});
    CHECK(r.status == 2 && strncmp(r.err, "usage: attograd-mha ", 20) == 0);
    r = run_tool((const char *[]){"-x", "a", "b", NULL});
    CHECK(r.status == 2 && strncmp(r.err, "attograd-mha: unknown option '-x'\nusage:", 40) == 0);
    r = run_tool((const char *[]){"--help", NULL});
    CHECK(r.status == 0 && strncmp(r.out, "usage: attograd-mha ", 20) == 0 && !r.err[0]);
    CHECK(strstr(r.out, "grad_output") != NULL);
    r = run_tool((const char *[]){"-h", NULL});
    CHECK(r.status == 0 && strncmp(r.out, "usage: attograd-mha ", 20) == 0);

    in_file f = valid_in(AG_F32);
    meta(&f, "causal", "1");
    const char *in = write_in(&f, "v.in.safetensors");
    char in_copy[640], out[640];
    snprintf(in_copy, sizeof in_copy, "%s", in);
    snprintf(out, sizeof out, "%s", testing_path("v.out.safetensors"));
    r = run_tool((const char *[]){"-v", in_copy, out, NULL});
    char want[1400];
    snprintf(want, sizeof want,
             "attograd-mha: F32 B=2 T=3 S=5 E=8 kdim=8 vdim=8 num_heads=2 bias causal: wrote 9 "
             "tensors to %s\n",
             out);
    CHECK(r.status == 0 && strcmp(r.err, want) == 0 && !r.out[0]);
    free_in(&f);
}


// An empty IN or OUT is a usage error found before anything runs: one line, status 2, and
// no temporary file (an empty OUT used to be computed, written to ".tmp.<pid>.<n>" in the
// working directory, and only then refused).
static void test_an_empty_in_or_out_is_refused_before_the_run(void) {
    in_file f = valid_in(AG_F64);
    char in[640], out[640], cwd[1024];
    snprintf(in, sizeof in, "%s", write_in(&f, "e.in.safetensors"));
    snprintf(out, sizeof out, "%s", testing_path("e.out.safetensors"));
    tool_run r = run_tool((const char *[]){"", out, NULL});
    CHECK(r.status == 2 && strcmp(r.err, "attograd-mha: IN is an empty path\n") == 0);
    CHECK(!exists(out));
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(testing_tmpdir()) == 0);  // where a temporary file for "" would go
    r = run_tool((const char *[]){in, "", NULL});
    CHECK(r.status == 2 && strcmp(r.err, "attograd-mha: OUT is an empty path\n") == 0);
    CHECK(testing_count_files(".tmp.") == 0);
    r = run_tool((const char *[]){"-v", "--", "", "", NULL});
    CHECK(r.status == 2 && strcmp(r.err, "attograd-mha: IN is an empty path\n") == 0);
    CHECK(chdir(cwd) == 0);
    free_in(&f);
}

// An OUT that is IN, by the same name, another one or a link: refused before the run, IN
// kept (it was replaced by the results, exit 0, and the inputs were gone).
static void test_an_out_that_is_in_is_refused_and_in_kept(void) {
    in_file f = valid_in(AG_F64);
    char in[640], other[700], link[640], want[2048];
    snprintf(in, sizeof in, "%s", write_in(&f, "same.in.safetensors"));
    size_t n, m;
    unsigned char *before = testing_read_file(in, &n);
    snprintf(other, sizeof other, "%s/./same.in.safetensors", testing_tmpdir());
    snprintf(link, sizeof link, "%s", testing_path("same.link.safetensors"));
    CHECK(symlink(in, link) == 0);
    const char *const outs[] = {in, other, link};
    for (int i = 0; i < 3; i++) {
        tool_run r = run_tool((const char *[]){in, outs[i], NULL});
        snprintf(want, sizeof want, "attograd-mha: OUT %s is the file IN %s: the results would "
                 "replace the inputs; name another OUT\n", outs[i], in);
        CHECK(r.status == 2 && strcmp(r.err, want) == 0);
        unsigned char *after = testing_read_file(in, &m);
        CHECK(before && after && m == n && memcmp(before, after, n) == 0);
        free(after);
    }
    unlink(link);
    free(before);
    free_in(&f);
}

int main(int argc, char **argv) {
    if (argc > 1) tool = argv[1];
    RUN(test_reference_has_every_case);
    RUN(test_every_f64_case_matches_pytorch_to_1e_10);
    RUN(test_every_f32_case_matches_pytorch_to_1e_5);
    RUN(test_fully_masked_query_gets_zero_weights_and_the_output_bias);
    RUN(test_separate_projections_of_equal_width_act_as_the_packed_one);
    RUN(test_gradients_are_per_input_and_sum_to_the_shared_tensors);
    RUN(test_u8_masks_act_as_bool_with_nonzero_as_true);
    RUN(test_causal_is_the_upper_triangle_and_zero_is_off);
    RUN(test_a_missing_tensor_is_named);
    RUN(test_half_the_biases_or_both_projection_forms_are_refused);
    RUN(test_an_unexpected_tensor_or_metadata_is_named);
    RUN(test_inconsistent_shapes_are_named);
    RUN(test_an_attention_matrix_too_large_to_allocate_is_refused);
    RUN(test_inconsistent_masks_and_separate_projections_are_named);
    RUN(test_a_bad_num_heads_or_causal_is_refused);
    RUN(test_mixed_or_wrong_dtypes_are_named);
    RUN(test_a_truncated_or_missing_file_is_one_line);
    RUN(test_a_failed_write_exits_2_and_leaves_out_as_it_was);
    RUN(test_usage_help_and_verbose);
    RUN(test_an_empty_in_or_out_is_refused_before_the_run);
    RUN(test_an_out_that_is_in_is_refused_and_in_kept);
    testing_remove_tmpdir();
    return testing_summary();
}
