// Internal declarations shared by the library's source files (never installed).
// Internal names that cross files carry the `agi_` prefix; file-local ones are
// static. The shared library exports only `ag_*` (see src/attograd.map).
#ifndef ATTOGRAD_INTERNAL_H
#define ATTOGRAD_INTERNAL_H

// Core's own public headers, and nothing above core: an op, a module, an
// optimizer or a file format is never visible here.
#include "attograd/base.h"
#include "attograd/gradcheck.h"
#include "attograd/params.h"
#include "attograd/random.h"
#include "attograd/tape.h"
#include "attograd/tensor.h"

// ---- Allocation: 64-byte aligned, counted (see ag_memory_stats) -------------
void *agi_malloc(size_t bytes);   // never NULL: out of memory is fatal
// The allocations the calling thread made, counting those of the pool's workers in the
// jobs it posted (which agi_allocations_credit adds), as ag_memory_usage counts the
// process's: a check that the calling thread's work allocates nothing reads this one,
// which other user threads do not move.
uint64_t agi_allocations_here(void);
void agi_allocations_credit(uint64_t n);
void *agi_calloc(size_t bytes);   // zero-filled
void agi_free(void *p);
char *agi_strdup(const char *s);
// Growable arrays: returns `arr` (which holds `count` elements of `elem` bytes
// and has room for *cap) if it has room for `need`; otherwise a new array with
// the `count` elements copied and arr freed, its capacity (stored in *cap)
// doubled from `first` until it holds `need`.
void *agi_reserve(void *arr, int *cap, int count, int need, int first, size_t elem);

// ---- Tensor bookkeeping (ag_tensor.agi_bookkeeping) -------------------------------------
enum {
    AGI_HEAP = 1u << 0,       // the struct and data were allocated by ag_tensor_zeros
    AGI_TAPE = 1u << 1,       // lives in a tape arena
    AGI_PARAM = 1u << 2,      // lives in a parameter store
    AGI_GRAD_LIVE = 1u << 3,  // received gradient during the current backward
    AGI_NO_DECAY = 1u << 4,   // weight decay leaves it alone (a tag: params.h says why here)
    AGI_VIEW = 1u << 5,       // ag_tensor_grad_view's: owns nothing, so it holds no gradient
};
// The bits above these count the writes of a tensor's values in place (ag_optim_step, the
// loads and inits, ag_tensor_fill, _copy and _set_item), modulo 2^24: a tape notes a
// parameter's count when a node reads it, and backward refuses a parameter written since
// (as PyTorch's version counter refuses a tensor saved for backward and changed in place).
enum { AGI_VERSION_SHIFT = 8 };
static inline void agi_tensor_written(ag_tensor *t) {
    t->agi_bookkeeping += 1u << AGI_VERSION_SHIFT;  // the carry out of bit 31 is the modulo
}
static inline uint32_t agi_tensor_version(const ag_tensor *t) {
    return t->agi_bookkeeping >> AGI_VERSION_SHIFT;
}

// ---- Sizes (here and size.c): every size computed from user input goes through these --
// The small ones are inline: every op of a decode step sizes its output through them, and
// as calls they were 5% of a small model's step (README, "Decoding speed").

// The element types' one table (base.c), indexed by ag_dtype, whose values are 0..5.
typedef struct agi_dtype_info {
    const char *name;  // ag_dtype_name
    size_t size;       // bytes of an element
} agi_dtype_info;
enum { AGI_DTYPES = 6 };
extern const agi_dtype_info agi_dtypes[AGI_DTYPES];

// ag_dtype_size: bytes of an element, 0 for an unknown dtype.
static inline size_t agi_dtype_size(ag_dtype dt) {
    return (unsigned)dt < AGI_DTYPES ? agi_dtypes[dt].size : 0;
}

static inline bool agi_is_float(ag_dtype dt) { return dt == AG_F32 || dt == AG_F64; }

// a * b and a + b, false when the result would exceed AG_MAX_BYTES (base.h), so that no
// size wraps. Counts of elements are bounded by the same number.
static inline bool agi_size_mul(size_t a, size_t b, size_t *out) {
    // Factors below 2^16 (2^32 where size_t has 64 bits) multiply exactly, so the product
    // itself is compared, without the division of the general case.
    const size_t half = (size_t)1 << (sizeof(size_t) * 4);
    if (a < half && b < half) {
        if (a * b > AG_MAX_BYTES) return false;
    } else if (b != 0 && a > AG_MAX_BYTES / b) {
        return false;
    }
    *out = a * b;
    return true;
}

static inline bool agi_size_add(size_t a, size_t b, size_t *out) {
    if (a > AG_MAX_BYTES || b > AG_MAX_BYTES - a) return false;
    *out = a + b;
    return true;
}

int agi_max_bytes_log2(void);  // 48 where AG_MAX_BYTES is 2^48

// numel * ag_dtype_size(dt) of `shape`, false when an extent is < 1 or the bytes exceed
// AG_MAX_BYTES.
static inline bool agi_shape_bytes(ag_dtype dt, int ndim, const int shape[], size_t *bytes) {
    size_t n = agi_dtype_size(dt);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1 || !agi_size_mul(n, (size_t)shape[i], &n)) return false;
    *bytes = n;
    return true;
}
// Validates a shape for a tensor of dtype dt: a known dtype, ndim in [0, AG_MAX_DIMS],
// shape non-NULL when ndim > 0, every extent >= 1, and the bytes within AG_MAX_BYTES;
// reports "<op>: ..." naming the shape and returns false if bad. Every tensor the
// library creates (heap, tape, parameter store, op outputs) passes this first.
bool agi_valid_shape(const char *op, ag_dtype dt, int ndim, const int shape[]);
// "[2,3,4]" for a shape not yet in a tensor (the rotating buffers of agi_shape).
const char *agi_shape_of(int ndim, const int shape[]);

// The product of the extents of a shape agi_valid_shape accepted.
static inline size_t agi_numel(int ndim, const int shape[]) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return n;
}
// Fills the header fields (no data) of a fresh tensor.
void agi_tensor_header(ag_tensor *t, ag_dtype dt, int ndim, const int shape[]);
// Ensures t->grad exists (zero-filled), allocating where t lives.
void agi_ensure_grad(ag_tape *tp, ag_tensor *t);

// A leaf view of rows [start, start + count) of t's first dimension, in tape
// memory: its data and grad alias t's, so gradient reaching the view lands in
// t's gradient (how MultiheadAttention uses slices of in_proj_weight). t's
// gradient is allocated first if t requires grad.
ag_tensor *agi_rows_view(ag_tape *tp, ag_tensor *t, int start, int count);

// A hook on what a tape records as an op's input: while set, ag_op_apply (and agi_rows_view)
// record fn(tp, t, ctx) in place of each input t (an input given twice is looked up once),
// and fail when it returns NULL (it has reported why). fn NULL removes it. How the
// threads of ag_data_parallel_step each record the shared parameters with gradients of
// their own (data_parallel.c).
typedef ag_tensor *(*agi_tape_input_fn)(ag_tape *tp, ag_tensor *t, void *ctx);
// bfloat16 copies of weights (kernels/bf16_weights.h) for the products of the ops
// recorded under autocast: the tape carries the table its owner set (a generator sets
// one) for the ops to use, and never reads it. NULL unless set.
struct agi_bf16_weights;
void agi_tape_set_bf16_weights(ag_tape *tp, struct agi_bf16_weights *t);
struct agi_bf16_weights *agi_tape_bf16_weights(const ag_tape *tp);
void agi_tape_set_input_hook(ag_tape *tp, agi_tape_input_fn fn, void *ctx);
// The tensor an op records for input t: t, or what the tape's input hook makes of it.
ag_tensor *agi_tape_input(ag_tape *tp, ag_tensor *t);
// The tensor a node's input t stands for: t, or, for the header copy ag_op_apply recorded
// of a frozen tensor holding a gradient buffer (without the buffer), that tensor; so that
// printers show one tensor read by several nodes once.
const ag_tensor *agi_tape_leaf(const ag_tape *tp, const ag_tensor *t);
// True when y is the output of a node of tp as it is now (not of another tape, nor of
// a node reset away): what backward from y on tp needs.
bool agi_tape_recorded(const ag_tape *tp, const ag_tensor *y);
// True, with why (a message's body) filled, when a parameter a node of tp reads has been
// resized since it was recorded (ag_params_resize): its nodes then no longer fit it, for
// backward nor for a replay.
bool agi_tape_params_resized(const ag_tape *tp, char *why, size_t size);
// The same, or a parameter written in place since (agi_tensor_written): its gradient
// would be taken at values the forward did not see.
bool agi_tape_params_changed(const ag_tape *tp, char *why, size_t size);
// The tape's autocast when node n was recorded (the precision its products took, for the
// ops that have products); AG_AUTOCAST_OFF for a node no longer on its tape.
ag_autocast agi_node_autocast(const ag_node *n);

// User text (names, paths) in a line of output, control bytes written as C escapes
// (escape.c): into dst (at most size bytes with its NUL, whole escapes only; false when
// src was cut), or to f.
bool agi_escape_into(char *dst, size_t size, const char *src);
void agi_fput_escaped(const char *s, FILE *f);

// A module's init that fails part-way takes back what it added: agi_params_mark is the
// store's parameter count before (0 for a NULL store), agi_params_truncate removes the
// parameters added after the first `count`.
int agi_params_mark(const ag_params *ps);
void agi_params_truncate(ag_params *ps, int count);

// ---- Shape strings for error messages ---------------------------------------------
// A few rotating buffers so that one message can show several shapes:
//     ag_error("matmul: inner dimensions differ: %s x %s", agi_shape(a), agi_shape(b));
const char *agi_shape(const ag_tensor *t);
// "f32 [2,3,4]" ("NULL" for no tensor), from the same rotating buffers: for a refusal
// where the dtype may be what is wrong, the shape alone looking right.
const char *agi_dtype_shape(const ag_tensor *t);

// The initialisers' draws (init.c), reporting in `op`'s name; false (after the
// error) when the tensor, generator or range is bad.
bool agi_init_uniform(const char *op, ag_tensor *t, ag_pcg32 *rng, double lo, double hi);
bool agi_init_normal(const char *op, ag_tensor *t, ag_pcg32 *rng, double mean, double std);

// Operands a message names, "q [2,4,8] and k [2,5,8]" ({"q", q, "k", k}) or "scores
// [2,4,5,7]" ({"scores", x}, t2 NULL): checks take this and format it with agi_about_text
// only when they report, not on every call of an op.
typedef struct {
    const char *name;
    const ag_tensor *t;
    const char *name2;
    const ag_tensor *t2;
} agi_about;
const char *agi_about_text(const agi_about *a);  // rotating buffers, as agi_shape's

// A handler of the calling thread's own, used in place of the process's (ag_error_handler_set)
// for the errors this thread reports, and those of the pool's workers in the jobs it posts;
// fn NULL: none, the process's. Returns the one it replaces, for the caller to put back.
// ag_op_check records its ops' refusals this way, so that two threads can each run one,
// and other threads' errors go where they always go.
typedef struct {
    ag_error_handler fn;
    void *user;
} agi_error_scope;
agi_error_scope agi_error_scope_set(agi_error_scope s);
agi_error_scope agi_error_scope_now(void);
// How many errors the calling thread has reported since it began, counting those of the
// pool's workers in the jobs it posted (agi_errors_credit): a caller that runs user code
// on several threads (a data-parallel step) compares it before and after, since a handler
// that returns leaves no other trace; another user thread's errors do not count.
unsigned long agi_errors_reported(void);
void agi_errors_credit(unsigned long n);
// True when p is not NULL; otherwise reports "fn: the what is NULL" and returns false:
// the one check of a handle (a tape, a tensor, a stream, an optimizer) that every
// public function taking one makes before touching it.
bool agi_given(const void *p, const char *fn, const char *what);

// ---- Failures on user data -----------------------------------------------------------
// Formats one line into err->msg (control bytes escaped, agi_escape_into); false when it
// was cut to fit, or err is NULL (then nothing is done).
bool agi_err_set(ag_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// A path as a message shows it: whole up to 200 bytes, else its first 80 bytes, "...",
// and its last 100 (where the file's name is). A path may be PATH_MAX bytes long, or
// longer when given by mistake: whole, it filled the line and cut off the problem.
// Into buf, returned; one buffer for each path of a message.
enum { AGI_PATH_SHOWN_SIZE = 184 };
const char *agi_path_shown(const char *path, char buf[AGI_PATH_SHOWN_SIZE]);

// ---- Numbers in files, whatever the locale (c_numbers.c) -------------------------------
// After setlocale(LC_ALL, ""), printf's "%g" and strtod take the locale's decimal point
// (',' in de_DE.UTF-8). Numbers that files and pages hold (checkpoint metadata, the tape's
// page and DOT graph) take '.' whatever the locale, as in the C locale. Printouts for
// people and messages follow the locale, as printf does.
// "%.*g" of v (digits at most 40) with '.' as the decimal point; returns snprintf's count.
int agi_format_g(char *buf, size_t size, int digits, double v);
// strtod as in the C locale: '.' is the decimal point, the locale's own ends the number.
double agi_strtod_c(const char *s, char **end);

// ---- Time ----------------------------------------------------------------------------
// Seconds on a monotonic clock, for measuring how long something took (clock.c).
double agi_seconds_now(void);

// ---- Runtime ----------------------------------------------------------------------
// Once per process: pins OpenBLAS to one thread (attograd owns the threading).
void agi_runtime_init(void);

#endif
