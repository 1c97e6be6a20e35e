// attograd-mha — torch.nn.MultiheadAttention (batch_first=True, eval mode) on
// the parameters and inputs in one safetensors file; the output, the attention
// weights and every gradient go to another. For checking attention code (your
// own, or PyTorch) against attograd's, tensor by tensor:
//
//     attograd-mha [-v] [--max-memory SIZE] IN.safetensors OUT.safetensors
//
// IN, under PyTorch's state_dict names (E = embed_dim, h = num_heads):
//   in_proj_weight [3E, E]            or q_proj_weight [E, E], k_proj_weight [E, kdim]
//                                        and v_proj_weight [E, vdim]
//   in_proj_bias [3E], out_proj.bias [E]   both, or neither (PyTorch's bias=False)
//   out_proj.weight [E, E]
//   query [B, T, E], key [B, S, kdim], value [B, S, vdim]
//   key_padding_mask [B, S]           optional: BOOL or U8, true (nonzero) = padding
//   attn_mask [T, S] or [B*h, T, S]   optional: BOOL or U8, true (nonzero) = masked;
//                                     or float, added to the scores
//   grad_output [B, T, E]             the gradient arriving at the output
//   bias_k, bias_v [1, 1, E]          optional, both or neither (PyTorch's add_bias_kv)
//   __metadata__  num_heads (required); causal "0" or "1" (optional); add_zero_attn
//                 "0" or "1" (optional, PyTorch's add_zero_attn); format
//                 (ignored: safetensors.torch writes it)
// Every float tensor is F64, and the computation runs in float64, or every
// one is F32, and it runs in float32. E, kdim, vdim and bias come from the
// tensors; every shape is checked against the others.
//
// OUT, in IN's float dtype:
//   output [B, T, E], attn_weights [B, T, S'] (S' = S + 1 for add_bias_kv, + 1 for
//   add_zero_attn; averaged over heads, as PyTorch's
//   need_weights=True, average_attn_weights=True), and grad.query, grad.key,
//   grad.value and grad.<name> for every parameter in IN.
//
// Semantics to know when comparing:
// - query, key and value are three separate leaves with three gradients. In
//   PyTorch, one tensor passed as both key and value (or as all three) gets
//   the SUM of their gradients: add grad.key and grad.value to compare.
// - No dropout: the module runs as PyTorch's does in eval mode.
// - causal "1" masks key j > query i (top-left aligned when T != S): the same
//   as passing torch.ones(T, S, dtype=torch.bool).triu(1) as attn_mask.
// - A query whose keys are all masked gets zero weights, so its output row is
//   out_proj.bias (PyTorch gives NaN there).
// - q/k/v_proj_weight are accepted even when kdim = vdim = E (where PyTorch
//   would pack them into in_proj_weight); their gradients come back under
//   their own names.
//
// Before allocating anything, the working memory the run needs is estimated
// (it grows as B * num_heads * T * S) and a run that needs more than the
// memory available (or than --max-memory SIZE) is refused with the amount.
//
// Exit status 0 on success, with nothing printed (-v: one summary line on
// stderr). Exit status 2 for a usage error, for anything wrong with IN, for a
// run that does not fit in memory, for an OUT in a missing directory or that
// is IN, and for a failed write of OUT, with one line on stderr saying what. OUT is replaced
// atomically: it is never left half-written, and a failed run leaves it as it was.
#define _POSIX_C_SOURCE 200809L  // getrlimit
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <attograd.h>

#define PROGRAM "attograd-mha"
// 2^28 cells: 1 GiB per f32 copy of the attention weights, 2 GiB in f64.
#define MAX_ATTENTION_CELLS 268435456.0

// ---- What IN may hold ---------------------------------------------------------------

enum { P_IN_PROJ_WEIGHT, P_Q_PROJ_WEIGHT, P_K_PROJ_WEIGHT, P_V_PROJ_WEIGHT,
       P_IN_PROJ_BIAS, P_OUT_PROJ_WEIGHT, P_OUT_PROJ_BIAS, P_BIAS_K, P_BIAS_V, N_PARAMS };
static const char *const param_names[N_PARAMS] = {
    "in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
    "in_proj_bias", "out_proj.weight", "out_proj.bias", "bias_k", "bias_v"};

enum { D_QUERY, D_KEY, D_VALUE, D_GRAD_OUTPUT, D_KEY_PADDING_MASK, D_ATTN_MASK, N_DATA };
static const char *const data_names[N_DATA] = {"query", "key", "value", "grad_output",
                                               "key_padding_mask", "attn_mask"};
// The inputs that get a gradient: query, key and value, the first three of data_names.
enum { N_LEAVES = 3 };

// One run of the program: what IN holds, the module built from it, the
// tape it runs on, and the first failure.
typedef struct job {
    // IN, once read and checked.
    ag_safetensors *in;
    const ag_tensor *param[N_PARAMS];  // NULL where absent
    const ag_tensor *data[N_DATA];     // NULL where absent (only the masks may be)
    int heads;
    bool causal, add_zero_attn;
    ag_dtype dtype;                    // of every float tensor, and of the run
    int B, T, S, E, kdim, vdim;
    bool bias;
    // The module and its run.
    ag_params *store;
    ag_mha mha;
    ag_tape *tape;
    ag_tensor *leaf[N_LEAVES];         // heap copies of query, key, value
    ag_tensor *key_padding_mask;       // heap copies: BOOL, and BOOL or float
    ag_tensor *attn_mask;
    ag_tensor *grad_output;
    ag_tensor *output, *weights;       // on the tape
    int written;                       // tensors in OUT
    char msg[1024];                    // the first failure, without the program name
} job;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static bool fail(job *j, const char *fmt, ...) {
    if (!j->msg[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->msg, sizeof j->msg, fmt, ap);
        va_end(ap);
    }
    return false;
}

// A library-level error (a shape the checks below let through, say) becomes
// the job's failure instead of the default handler's abort; the failing
// library call then returns NULL, which the caller notices.
static void record_library_error(const char *message, void *user) {
    fail(user, "%s", message);
}

// A tensor's shape as "[2,3,8]", in one of a few rotating buffers, so one
// message can show several.
static const char *shape(const ag_tensor *t) {
    static char bufs[6][64];
    static int next;
    char *b = bufs[next];
    next = (next + 1) % 6;
    return ag_tensor_shape_str(t, b, sizeof bufs[0]);
}

static bool is_float(ag_dtype dt) { return dt == AG_F32 || dt == AG_F64; }
static bool is_flag(ag_dtype dt) { return dt == AG_BOOL || dt == AG_U8; }

static int index_of(const char *const names[], int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}

// ---- Step 1: read IN and check everything in it ----------------------------------------

// "self_attn.in_proj_weight" -> "in_proj_weight": the known name a tensor
// probably meant when it carries a module prefix; NULL otherwise.
static const char *unprefixed(const char *name) {
    size_t n = strlen(name);
    for (int k = 0; k < N_PARAMS + N_DATA; k++) {
        const char *known = k < N_PARAMS ? param_names[k] : data_names[k - N_PARAMS];
        size_t m = strlen(known);
        if (n > m + 1 && name[n - m - 1] == '.' && strcmp(name + n - m, known) == 0)
            return known;
    }
    return NULL;
}

// Every tensor and metadata key must be one this program knows: a misspelt
// name must not quietly turn into bias=False or a missing mask.
static bool sort_names(job *j) {
    for (int i = 0; i < ag_safetensors_count(j->in); i++) {
        const char *name = ag_safetensors_name(j->in, i);
        const ag_tensor *t = ag_safetensors_at(j->in, i);
        int p = index_of(param_names, N_PARAMS, name), d = index_of(data_names, N_DATA, name);
        if (p >= 0) {
            j->param[p] = t;
        } else if (d >= 0) {
            j->data[d] = t;
        } else if (unprefixed(name)) {
            return fail(j, "unexpected tensor '%s' (names carry no module prefix: '%s')", name,
                        unprefixed(name));
        } else {
            return fail(j, "unexpected tensor '%s'", name);
        }
    }
    for (int i = 0; i < ag_safetensors_meta_count(j->in); i++) {
        const char *key = ag_safetensors_meta_key(j->in, i);
        if (strcmp(key, "num_heads") && strcmp(key, "causal") && strcmp(key, "format") &&
            strcmp(key, "add_zero_attn"))
            return fail(j, "unexpected metadata '%s' (known: num_heads, causal, add_zero_attn, "
                           "format)",
                        key);
    }
    return true;
}

// num_heads: decimal digits only (no sign, no spaces), 1 to INT_MAX.
static bool read_config(job *j) {
    const char *h = ag_safetensors_meta(j->in, "num_heads");
    if (!h) return fail(j, "metadata num_heads is missing (the number of attention heads)");
    long long v = 0;
    bool ok = *h != 0;
    for (const char *c = h; *c && ok; c++) {
        ok = *c >= '0' && *c <= '9';
        v = v * 10 + (*c - '0');  // v <= INT_MAX before: no overflow in long long
        ok = ok && v <= INT_MAX;
    }
    if (!ok || v < 1) return fail(j, "metadata num_heads '%s' must be a positive integer", h);
    j->heads = (int)v;
    const char *c = ag_safetensors_meta(j->in, "causal");
    if (c && strcmp(c, "0") && strcmp(c, "1"))
        return fail(j, "metadata causal '%s' must be '0' or '1'", c);
    j->causal = c && !strcmp(c, "1");
    const char *z = ag_safetensors_meta(j->in, "add_zero_attn");
    if (z && strcmp(z, "0") && strcmp(z, "1"))
        return fail(j, "metadata add_zero_attn '%s' must be '0' or '1'", z);
    j->add_zero_attn = z && !strcmp(z, "1");
    return true;
}

static bool check_presence(job *j) {
    static const char *const forms[] = {"[B,T,E]", "[B,S,kdim]", "[B,S,vdim]", "[B,T,E]"};
    for (int d = D_QUERY; d <= D_GRAD_OUTPUT; d++)
        if (!j->data[d]) return fail(j, "missing tensor '%s' %s", data_names[d], forms[d]);

    const ag_tensor *const *p = j->param;
    int separate = p[P_Q_PROJ_WEIGHT] ? P_Q_PROJ_WEIGHT
                   : p[P_K_PROJ_WEIGHT] ? P_K_PROJ_WEIGHT
                   : p[P_V_PROJ_WEIGHT] ? P_V_PROJ_WEIGHT
                                        : -1;
    if (p[P_IN_PROJ_WEIGHT] && separate >= 0)
        return fail(j, "in_proj_weight and %s are both given: use the packed or the separate "
                       "projections, not both",
                    param_names[separate]);
    if (!p[P_IN_PROJ_WEIGHT] && separate < 0)
        return fail(j, "missing tensor 'in_proj_weight' [3E,E] (or q_proj_weight, k_proj_weight "
                       "and v_proj_weight)");
    static const char *const proj_forms[] = {"[E,E]", "[E,kdim]", "[E,vdim]"};
    for (int k = 0; separate >= 0 && k < 3; k++)
        if (!p[P_Q_PROJ_WEIGHT + k])
            return fail(j, "missing tensor '%s' %s: separate projections need q_proj_weight, "
                           "k_proj_weight and v_proj_weight",
                        param_names[P_Q_PROJ_WEIGHT + k], proj_forms[k]);
    if (!p[P_OUT_PROJ_WEIGHT]) return fail(j, "missing tensor 'out_proj.weight' [E,E]");
    if (!p[P_IN_PROJ_BIAS] != !p[P_OUT_PROJ_BIAS]) {
        int given = p[P_IN_PROJ_BIAS] ? P_IN_PROJ_BIAS : P_OUT_PROJ_BIAS;
        int absent = given == P_IN_PROJ_BIAS ? P_OUT_PROJ_BIAS : P_IN_PROJ_BIAS;
        return fail(j, "%s is given but %s is not: PyTorch's bias=False drops both",
                    param_names[given], param_names[absent]);
    }
    j->bias = p[P_IN_PROJ_BIAS] != NULL;
    if (!p[P_BIAS_K] != !p[P_BIAS_V])
        return fail(j, "%s is given but %s is not: PyTorch's add_bias_kv makes both",
                    p[P_BIAS_K] ? "bias_k" : "bias_v", p[P_BIAS_K] ? "bias_v" : "bias_k");
    return true;
}

// Masks are flags (or, for attn_mask, additive floats); every other tensor
// is float, and all floats share one dtype, which the run then uses.
static bool check_dtypes(job *j) {
    const ag_tensor *kpm = j->data[D_KEY_PADDING_MASK], *am = j->data[D_ATTN_MASK];
    if (kpm && !is_flag(kpm->dtype))
        return fail(j, "key_padding_mask is %s; it must be BOOL or U8 (true = padding)",
                    ag_safetensors_dtype_name(kpm->dtype));
    if (am && !is_flag(am->dtype) && !is_float(am->dtype))
        return fail(j, "attn_mask is %s; it must be BOOL or U8 (true = masked), or F32 or F64 "
                       "(added to the scores)",
                    ag_safetensors_dtype_name(am->dtype));

    const ag_tensor *floats[N_DATA + N_PARAMS];
    const char *names[N_DATA + N_PARAMS];
    int n = 0;
    for (int d = D_QUERY; d <= D_ATTN_MASK; d++) {
        if (!j->data[d] || d == D_KEY_PADDING_MASK || (d == D_ATTN_MASK && is_flag(am->dtype)))
            continue;
        floats[n] = j->data[d];
        names[n++] = data_names[d];
    }
    for (int p = 0; p < N_PARAMS; p++) {
        if (!j->param[p]) continue;
        floats[n] = j->param[p];
        names[n++] = param_names[p];
    }
    int f32 = 0, f64 = 0;
    for (int i = 0; i < n; i++) {
        if (!is_float(floats[i]->dtype))
            return fail(j, "%s is %s; it must be F32 or F64", names[i],
                        ag_safetensors_dtype_name(floats[i]->dtype));
        f32 += floats[i]->dtype == AG_F32;
        f64 += floats[i]->dtype == AG_F64;
    }
    if (f32 && f64) {
        char list[2][600] = {"", ""};
        for (int i = 0; i < n; i++) {
            char *l = list[floats[i]->dtype == AG_F32];
            size_t len = strlen(l);
            snprintf(l + len, sizeof list[0] - len, "%s%s", len ? ", " : "", names[i]);
        }
        return fail(j, "mixed float dtypes (F64: %s; F32: %s): every float tensor must be F64, "
                       "or every one F32",
                    list[0], list[1]);
    }
    j->dtype = floats[0]->dtype;
    return true;
}

// Fails with "<name> <shape> must be <form> = <dims> (<why>)" unless t has
// exactly those dims.
static bool expect(job *j, const char *name, const ag_tensor *t, const char *form, int ndim,
                   const int dims[], const char *why) {
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == dims[i];
    if (ok) return true;
    char want[96] = "[";
    for (int i = 0; i < ndim; i++) {
        size_t len = strlen(want);
        snprintf(want + len, sizeof want - len, "%d%s", dims[i], i + 1 < ndim ? "," : "]");
    }
    return fail(j, "%s %s must be %s = %s (%s)", name, shape(t), form, want, why);
}

// query, key and value fix B, T, S, E, kdim and vdim; everything else must
// agree with them.
static bool check_shapes(job *j) {
    const ag_tensor *q = j->data[D_QUERY], *k = j->data[D_KEY], *v = j->data[D_VALUE];
    if (q->ndim != 3) return fail(j, "query %s must be [B,T,E] (3-D, batch first)", shape(q));
    if (k->ndim != 3) return fail(j, "key %s must be [B,S,kdim] (3-D, batch first)", shape(k));
    if (v->ndim != 3) return fail(j, "value %s must be [B,S,vdim] (3-D, batch first)", shape(v));
    if (k->shape[0] != v->shape[0] || k->shape[1] != v->shape[1])
        return fail(j, "key %s and value %s must have the same batch and length", shape(k),
                    shape(v));
    if (q->shape[0] != k->shape[0])
        return fail(j, "query %s and key %s must have the same batch", shape(q), shape(k));
    int B = j->B = q->shape[0], T = j->T = q->shape[1], E = j->E = q->shape[2];
    int S = j->S = k->shape[1], kdim = j->kdim = k->shape[2], vdim = j->vdim = v->shape[2];
    if (E % j->heads)
        return fail(j, "num_heads %d does not divide embed_dim %d (query %s)", j->heads, E,
                    shape(q));
    // in_proj_weight has 3E rows and attn_mask B*num_heads: counts a tensor
    // cannot have are refused here, before they are computed in int.
    if (E > INT_MAX / 3)
        return fail(j, "embed_dim %d (query %s) is too large: in_proj_weight [3*E,E] would "
                       "have more than %d rows",
                    E, shape(q), INT_MAX);
    if ((long long)B * j->heads > INT_MAX)
        return fail(j, "batch %d times num_heads %d (query %s) is more than %d", B, j->heads,
                    shape(q), INT_MAX);

    char from_q[96], from_k[160], from_v[160], from_kv[96];
    snprintf(from_q, sizeof from_q, "E from query %s", shape(q));
    snprintf(from_k, sizeof from_k, "E from query %s, kdim from key %s", shape(q), shape(k));
    snprintf(from_v, sizeof from_v, "E from query %s, vdim from value %s", shape(q), shape(v));
    snprintf(from_kv, sizeof from_kv, "B and S from key %s", shape(k));
    const ag_tensor *const *p = j->param;
    if (!expect(j, "grad_output", j->data[D_GRAD_OUTPUT], "[B,T,E]", 3, (int[]){B, T, E},
                "the output's shape, from query"))
        return false;
    if (p[P_IN_PROJ_WEIGHT]) {
        if (!expect(j, "in_proj_weight", p[P_IN_PROJ_WEIGHT], "[3*E,E]", 2, (int[]){3 * E, E},
                    from_q))
            return false;
        const ag_tensor *kv[2] = {k, v};
        for (int i = 0; i < 2; i++)
            if (kv[i]->shape[2] != E)
                return fail(j, "%s %s has %s %d, not embed_dim %d: in_proj_weight needs kdim = "
                               "vdim = embed_dim (give q_proj_weight, k_proj_weight and "
                               "v_proj_weight instead)",
                            i ? "value" : "key", shape(kv[i]), i ? "vdim" : "kdim",
                            kv[i]->shape[2], E);
    } else if (!expect(j, "q_proj_weight", p[P_Q_PROJ_WEIGHT], "[E,E]", 2, (int[]){E, E}, from_q) ||
               !expect(j, "k_proj_weight", p[P_K_PROJ_WEIGHT], "[E,kdim]", 2, (int[]){E, kdim},
                       from_k) ||
               !expect(j, "v_proj_weight", p[P_V_PROJ_WEIGHT], "[E,vdim]", 2, (int[]){E, vdim},
                       from_v)) {
        return false;
    }
    if (j->bias && (!expect(j, "in_proj_bias", p[P_IN_PROJ_BIAS], "[3*E]", 1, (int[]){3 * E},
                            from_q) ||
                    !expect(j, "out_proj.bias", p[P_OUT_PROJ_BIAS], "[E]", 1, (int[]){E}, from_q)))
        return false;
    if (!expect(j, "out_proj.weight", p[P_OUT_PROJ_WEIGHT], "[E,E]", 2, (int[]){E, E}, from_q))
        return false;
    if (p[P_BIAS_K] &&
        (!expect(j, "bias_k", p[P_BIAS_K], "[1,1,E]", 3, (int[]){1, 1, E}, from_q) ||
         !expect(j, "bias_v", p[P_BIAS_V], "[1,1,E]", 3, (int[]){1, 1, E}, from_q)))
        return false;

    const ag_tensor *kpm = j->data[D_KEY_PADDING_MASK], *am = j->data[D_ATTN_MASK];
    if (kpm && !expect(j, "key_padding_mask", kpm, "[B,S]", 2, (int[]){B, S}, from_kv))
        return false;
    if (am) {
        bool ok2 = am->ndim == 2 && am->shape[0] == T && am->shape[1] == S;
        bool ok3 = am->ndim == 3 && am->shape[0] == B * j->heads && am->shape[1] == T &&
                   am->shape[2] == S;
        if (!ok2 && !ok3)
            return fail(j, "attn_mask %s must be [T,S] = [%d,%d] or [B*num_heads,T,S] = "
                           "[%d,%d,%d] (from query %s, key %s, num_heads %d)",
                        shape(am), T, S, B * j->heads, T, S, shape(q), shape(k), j->heads);
    }
    // The weights the tool returns need the whole [B, num_heads, T, S] matrix
    // (a few copies of it); refuse sizes that cannot be allocated rather than
    // let the allocator stop the program.
    double cells = (double)B * j->heads * T * S;
    if (cells > MAX_ATTENTION_CELLS)
        return fail(j, "query %s and key %s with num_heads %d need a %.3g-element attention "
                       "matrix; this tool handles at most %.3g",
                    shape(q), shape(k), j->heads, cells, MAX_ATTENTION_CELLS);
    return true;
}

// ---- Step 1b: will the run fit in memory? ---------------------------------------------------

// What the run needs, in bytes: an upper bound of the program's measured
// peak memory (README.md, attograd-mha): values per cell of the per-head
// attention matrices (scores, probabilities, their gradients) and of the
// head-averaged weights (on the tape, in OUT and its serialisation), generous
// terms for the activations and the parameters (values, gradients, copies in
// IN and OUT), and a fixed 64 MiB. Computed in double: no size in IN can
// overflow it.
static double working_memory(const job *j) {
    double B = j->B, T = j->T, S = j->S, E = j->E, h = j->heads;
    double params = 0;
    for (int p = 0; p < N_PARAMS; p++)
        if (j->param[p]) params += (double)j->param[p]->numel;
    double values = 5 * B * h * T * S + 3 * B * T * S +
                    16 * (B * T * E + B * S * (E + j->kdim + j->vdim)) + 6 * params;
    return values * (double)ag_dtype_size(j->dtype) + 64.0 * (1 << 20);
}

// Reads one number from a file such as /sys/fs/cgroup/memory.max; NAN when
// the file is absent or says something else ("max").
static double number_in(const char *path) {
    FILE *f = fopen(path, "r");
    double v = NAN;
    char text[64];
    if (f && fgets(text, sizeof text, f)) {
        char *end;
        v = strtod(text, &end);
        if (end == text || (*end && *end != '\n')) v = NAN;
    }
    if (f) fclose(f);
    return v;
}

// The memory this process may still use, in bytes: the least of the
// system's available memory, the room left under a cgroup (container) limit,
// and the address-space and data limits; INFINITY when none is known.
static double available_memory(void) {
    double avail = INFINITY;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = fmin(avail, 1024.0 * kb);
    if (f) fclose(f);
    double max = number_in("/sys/fs/cgroup/memory.max");
    double used = number_in("/sys/fs/cgroup/memory.current");
    if (!isnan(max)) avail = fmin(avail, max - (isnan(used) ? 0 : used));
    int limits[] = {RLIMIT_AS, RLIMIT_DATA};
    for (int i = 0; i < 2; i++) {
        struct rlimit rl;
        if (getrlimit(limits[i], &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
            avail = fmin(avail, (double)rl.rlim_cur);
    }
    return avail;
}

// Refuses, with the amount, a run that cannot fit: the allocator would
// otherwise stop the program part-way (SIGABRT after 8.4 GB on a 513 KB IN).
static bool check_memory(job *j, double max_memory) {
    double need = working_memory(j), have = fmin(available_memory(), max_memory);
    if (need <= have) return true;
    return fail(j, "B=%d T=%d S=%d num_heads=%d in %s need about %.2f GB of working memory "
                   "(%.3g attention cells); %.2f GB is %s",
                j->B, j->T, j->S, j->heads, j->dtype == AG_F64 ? "float64" : "float32", need / 1e9,
                (double)j->B * j->heads * j->T * j->S, have / 1e9,
                have == max_memory ? "allowed (--max-memory)" : "available");
}

// "--max-memory" SIZE: digits, then K, M, G or T (powers of 1024) or nothing
// (bytes); 0 when the text is anything else.
static double parse_size(const char *s) {
    size_t digits = strspn(s, "0123456789");
    if (digits == 0 || digits > 15) return 0;
    double v = strtod(s, NULL);
    const char *units = "KMGT", *u = s[digits] ? strchr(units, s[digits]) : NULL;
    if (s[digits] && (!u || s[digits + 1])) return 0;
    for (const char *k = units; u && k <= u; k++) v *= 1024;
    return v;
}

static bool load_input(job *j, const char *path, double max_memory) {
    ag_err err;
    if (!(j->in = ag_safetensors_load(path, &err))) return fail(j, "%s", err.msg);
    return sort_names(j) && read_config(j) && check_presence(j) && check_dtypes(j) &&
           check_shapes(j) && check_memory(j, max_memory);
}

// ---- Step 2: the module, with IN's parameter values -----------------------------------------

// Where IN's parameter p lives in the module: a tensor, and an element offset
// into it. Separate q/k/v weights are rows of the packed in_proj_weight when
// the module packs them (kdim = vdim = E).
static ag_tensor *module_tensor(const job *j, int p, size_t *offset) {
    const ag_mha *m = &j->mha;
    *offset = 0;
    switch (p) {
    case P_IN_PROJ_WEIGHT: return m->in_proj_weight;
    case P_Q_PROJ_WEIGHT:
    case P_K_PROJ_WEIGHT:
    case P_V_PROJ_WEIGHT: {
        ag_tensor *separate[3] = {m->q_proj_weight, m->k_proj_weight, m->v_proj_weight};
        int i = p - P_Q_PROJ_WEIGHT;
        if (separate[i]) return separate[i];
        *offset = (size_t)i * j->E * j->E;
        return m->in_proj_weight;
    }
    case P_IN_PROJ_BIAS: return m->in_proj_bias;
    case P_OUT_PROJ_WEIGHT: return m->out_proj.weight;
    case P_OUT_PROJ_BIAS: return m->out_proj.bias;
    case P_BIAS_K: return m->bias_k;
    case P_BIAS_V: return m->bias_v;
    }
    return NULL;
}

static bool build_module(job *j) {
    ag_mha_config cfg = {.embed_dim = j->E, .num_heads = j->heads, .no_bias = !j->bias,
                         .kdim = j->kdim, .vdim = j->vdim,
                         .add_bias_kv = j->param[P_BIAS_K] != NULL,
                         .add_zero_attn = j->add_zero_attn};
    ag_pcg32 rng = ag_pcg32_make(0, 0);  // every initial value is overwritten below
    j->store = ag_params_new(j->dtype);
    if (!ag_mha_init(&j->mha, j->store, "", &cfg, &rng))
        return fail(j, "cannot build MultiheadAttention(%d, %d)", j->E, j->heads);
    size_t size = ag_dtype_size(j->dtype);
    for (int p = 0; p < N_PARAMS; p++) {
        const ag_tensor *src = j->param[p];
        if (!src) continue;
        size_t offset;
        ag_tensor *dst = module_tensor(j, p, &offset);
        if (!dst || dst->numel < offset + src->numel)
            return fail(j, "%s %s has no place in the module", param_names[p], shape(src));
        memcpy((char *)dst->data + offset * size, src->data, src->numel * size);
    }
    return true;
}

// ---- Step 3: forward and backward ------------------------------------------------------------

static bool run(job *j) {
    j->tape = ag_tape_new();
    for (int i = 0; i < N_LEAVES; i++) {
        if (!(j->leaf[i] = ag_tensor_convert(j->data[i], j->dtype))) return fail(j, "out of memory");
        ag_tensor_set_requires_grad(j->leaf[i], true);
    }
    j->grad_output = ag_tensor_convert(j->data[D_GRAD_OUTPUT], j->dtype);
    const ag_tensor *kpm = j->data[D_KEY_PADDING_MASK], *am = j->data[D_ATTN_MASK];
    if (kpm) j->key_padding_mask = ag_tensor_convert(kpm, AG_BOOL);  // U8: nonzero = true
    if (am) j->attn_mask = ag_tensor_convert(am, is_flag(am->dtype) ? AG_BOOL : j->dtype);

    ag_mha_opts opts = {.key_padding_mask = j->key_padding_mask, .attn_mask = j->attn_mask,
                        .causal = j->causal};
    j->output = ag_mha_forward(j->tape, &j->mha, j->leaf[D_QUERY], j->leaf[D_KEY],
                               j->leaf[D_VALUE], &opts, &j->weights);
    if (!j->output || !j->weights || j->msg[0]) return fail(j, "the forward pass failed");
    ag_backward_with(j->tape, j->output, j->grad_output);
    return j->msg[0] == 0;
}

// ---- Step 4: write OUT -----------------------------------------------------------------------

// Adds `values` (numel elements of the run's dtype, or zeros where no
// gradient arrived: NULL) under `name`, with the shape of `like`.
static bool add(job *j, ag_safetensors *st, const char *name, const ag_tensor *like,
                const void *values) {
    ag_tensor *t = values ? ag_tensor_from(j->dtype, like->ndim, like->shape, values)
                          : ag_tensor_zeros(j->dtype, like->ndim, like->shape);
    if (!t) return fail(j, "cannot make tensor '%s'", name);
    ag_err err;
    int rc = ag_safetensors_add(st, name, t, &err);
    ag_tensor_free(t);
    if (rc) return fail(j, "%s", err.msg);
    j->written++;
    return true;
}

static bool write_output(job *j, const char *path) {
    ag_safetensors *st = ag_safetensors_new();
    bool ok = add(j, st, "output", j->output, j->output->data) &&
              add(j, st, "attn_weights", j->weights, j->weights->data);
    char name[64];
    for (int i = 0; ok && i < N_LEAVES; i++) {
        snprintf(name, sizeof name, "grad.%s", data_names[i]);
        ok = add(j, st, name, j->leaf[i], j->leaf[i]->grad);
    }
    size_t size = ag_dtype_size(j->dtype);
    for (int p = 0; ok && p < N_PARAMS; p++) {
        if (!j->param[p]) continue;
        size_t offset;
        const ag_tensor *t = module_tensor(j, p, &offset);
        snprintf(name, sizeof name, "grad.%s", param_names[p]);
        ok = add(j, st, name, j->param[p], t->grad ? (char *)t->grad + offset * size : NULL);
    }
    char version[64];
    snprintf(version, sizeof version, "attograd %s", ag_version());
    ag_err err;
    if (ok && ag_safetensors_set_meta(st, "written_by", version, &err)) ok = fail(j, "%s", err.msg);
    if (ok && ag_safetensors_save(st, path, &err)) ok = fail(j, "%s", err.msg);
    ag_safetensors_free(st);
    return ok;
}

// ---- The program -------------------------------------------------------------------------------

static void job_free(job *j) {
    for (int i = 0; i < N_LEAVES; i++) ag_tensor_free(j->leaf[i]);
    ag_tensor_free(j->grad_output);
    ag_tensor_free(j->key_padding_mask);
    ag_tensor_free(j->attn_mask);
    ag_tape_free(j->tape);
    ag_params_free(j->store);
    ag_safetensors_free(j->in);
}

#define USAGE "usage: " PROGRAM " [-v] [--max-memory SIZE] IN.safetensors OUT.safetensors\n"

// After a usage error: the synopsis and where to read more.
static void short_usage(void) {
    fputs(USAGE "Run '" PROGRAM " --help' for what IN and OUT hold.\n", stderr);
}

static void help(void) {
    fputs(USAGE
          "\n"
          "Runs torch.nn.MultiheadAttention (batch_first=True, eval mode: no dropout) on the\n"
          "parameters and inputs in IN and writes the output, the head-averaged attention\n"
          "weights and the gradients to OUT.\n"
          "\n"
          "IN:  in_proj_weight [3E,E] (or q_proj_weight [E,E], k_proj_weight [E,kdim],\n"
          "     v_proj_weight [E,vdim]), out_proj.weight [E,E], and in_proj_bias [3E] with\n"
          "     out_proj.bias [E] unless bias=False; query [B,T,E], key [B,S,kdim],\n"
          "     value [B,S,vdim], grad_output [B,T,E]; optional key_padding_mask [B,S]\n"
          "     (BOOL/U8, true = padding) and attn_mask [T,S] or [B*h,T,S] (BOOL/U8,\n"
          "     true = masked, or float, added); optional bias_k, bias_v [1,1,E]\n"
          "     (add_bias_kv). Metadata: num_heads (required), causal and add_zero_attn\n"
          "     (\"0\" or \"1\"). All float tensors F64 (run in float64) or all F32.\n"
          "OUT: output [B,T,E], attn_weights [B,T,S+extra keys], grad.query, grad.key, grad.value\n"
          "     (separate leaves: PyTorch sums them when they are one tensor) and\n"
          "     grad.<name> for every parameter.\n"
          "A query whose keys are all masked gets zero weights (PyTorch: NaN).\n"
          "\n"
          "  -v          print a summary line to stderr\n"
          "  --max-memory SIZE  refuse a run estimated to need more working memory than\n"
          "              SIZE bytes (suffix K, M, G or T: powers of 1024); a run that\n"
          "              needs more than the memory available is always refused\n"
          "  -h, --help  print this help\n"
          "\n"
          "Exit status: 0 on success; 2 for bad usage, a bad IN or a failed write of OUT\n"
          "(with one line on stderr). OUT is replaced atomically.\n",
          stdout);
}

// The failure as one line, whatever bytes the file's names held.
static void print_failure(const char *msg) {
    fputs(PROGRAM ": ", stderr);
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++)
        fputc(*c < 0x20 || *c == 0x7f ? '?' : *c, stderr);
    fputc('\n', stderr);
}

static void print_summary(const job *j, const char *out) {
    const ag_tensor *am = j->data[D_ATTN_MASK];
    fprintf(stderr,
            PROGRAM ": %s B=%d T=%d S=%d E=%d kdim=%d vdim=%d num_heads=%d%s%s%s%s%s%s%s: "
                    "wrote %d tensors to %s\n",
            ag_safetensors_dtype_name(j->dtype), j->B, j->T, j->S, j->E, j->kdim, j->vdim,
            j->heads, j->bias ? " bias" : " bias=False", j->causal ? " causal" : "",
            j->data[D_KEY_PADDING_MASK] ? " key_padding_mask" : "", am ? " attn_mask " : "",
            am ? ag_safetensors_dtype_name(am->dtype) : "", am ? " " : "", am ? shape(am) : "",
            j->written, out);
}

int main(int argc, char **argv) {
    const char *paths[2];
    int n = 0;
    bool verbose = false, options = true, too_many = false;
    double max_memory = INFINITY;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && a[0] == '-' && a[1]) {
            if (!strcmp(a, "--")) {
                options = false;
            } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                help();
                return 0;
            } else if (!strcmp(a, "-v")) {
                verbose = true;
            } else if (!strcmp(a, "--max-memory")) {
                if (i + 1 == argc || !(max_memory = parse_size(argv[i + 1]))) {
                    fprintf(stderr, PROGRAM ": --max-memory needs a size such as 4G, got '%s'\n",
                            i + 1 < argc ? argv[i + 1] : "");
                    return 2;
                }
                i++;
            } else {
                fprintf(stderr, PROGRAM ": unknown option '%s'\n", a);
                short_usage();
                return 2;
            }
        } else if (n < 2) {
            paths[n++] = a;
        } else {
            too_many = true;
        }
    }
    if (n != 2 || too_many) {
        short_usage();
        return 2;
    }
    // Before anything is read or computed: an empty OUT would otherwise be found out only
    // after the whole run, when its temporary file (".tmp.<pid>.<n>" in the working
    // directory) could not be renamed to it.
    for (int i = 0; i < 2; i++)
        if (!paths[i][0]) {
            fprintf(stderr, PROGRAM ": %s is an empty path\n", i ? "OUT" : "IN");
            return 2;
        }
    // So is an OUT that cannot name a file (a directory, a FIFO, one ending in '/') or
    // whose directory is not there (the run was computed in full, and then its temporary
    // file could not be made).
    ag_err path_err;
    if (ag_file_path_check(paths[1], &path_err)) {
        print_failure(path_err.msg);
        return 2;
    }

    // And an OUT that is IN, by any name or link: the run replaced its own input with its
    // results, and the file it was to be checked against was gone.
    struct stat in_st, out_st;
    if (stat(paths[0], &in_st) == 0 && stat(paths[1], &out_st) == 0 &&
        in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino) {
        char msg[1024];
        snprintf(msg, sizeof msg, "OUT %.400s is the file IN %.400s: the results would replace "
                 "the inputs; name another OUT", paths[1], paths[0]);
        print_failure(msg);
        return 2;
    }

    job j = {0};
    ag_error_handler_set(record_library_error, &j);
    bool ok = load_input(&j, paths[0], max_memory) && build_module(&j) && run(&j) &&
              write_output(&j, paths[1]);
    if (!ok) print_failure(j.msg[0] ? j.msg : "failed");
    if (ok && verbose) print_summary(&j, paths[1]);
    job_free(&j);
    ag_error_handler_set(NULL, NULL);
    return ok ? 0 : 2;
}
