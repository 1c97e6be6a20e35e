// attograd/base.h — dtypes, errors, memory accounting, threads, version.
//
// Everything here is small and global by nature; every piece of global state
// attograd keeps is listed in this header:
//   - the error handler (ag_error_handler_set),
//   - the heap-allocation counters (ag_memory_usage),
//   - the thread count (ag_threads_set).
// A global setting is a noun of its own: ag_threads() reads it, ag_threads_set(n)
// writes it (the naming rule is at the top of attograd.h).
// Randomness is never global: a pcg32 generator is always passed in.
#ifndef ATTOGRAD_BASE_H
#define ATTOGRAD_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Element types. Training runs in AG_F32; gradient checks run the very same
// code in AG_F64. AG_BOOL (one byte per element, 0 or 1) carries masks.
// AG_U8, AG_I32 and AG_I64 (uint8_t, int32_t, int64_t) are storage types:
// tensors of them can be created, read, written and saved (token ids, class
// labels, counters), but ops take only f32 and f64, and only those can
// require grad.
typedef enum ag_dtype {
    AG_F32 = 0,
    AG_F64 = 1,
    AG_BOOL = 2,
    AG_U8 = 3,
    AG_I32 = 4,
    AG_I64 = 5
} ag_dtype;

// "f32", "f64", "bool", "u8", "i32", "i64"; "?" for anything else.
const char *ag_dtype_name(ag_dtype dt);
size_t ag_dtype_size(ag_dtype dt);  // bytes per element; 0 for an unknown dtype

// ---- Version and ABI ----------------------------------------------------------
// Semantic versioning, with the rule for 0.x: while MAJOR is 0, every change of the
// ABI (a public struct's layout, a function's signature, an enum's values, a function
// removed) bumps MINOR, and the shared library's SONAME carries MAJOR.MINOR
// (libattograd.so.0.3), so a program linked against another 0.x fails to load instead
// of running on the wrong layout. PATCH releases keep the ABI. From 1.0 on, the SONAME
// carries MAJOR only and MINOR releases only add. The numbers are written here, once;
// the build reads them from this file.
#define AG_VERSION_MAJOR 0
#define AG_VERSION_MINOR 4
#define AG_VERSION_PATCH 2

const char *ag_version(void);  // the library's "MAJOR.MINOR.PATCH"

// For code that does not reach the library through its SONAME (a binding that opens it
// by path, a plugin, a program linked statically against a library built apart): pass
// the version of the headers you were built against, before any other call,
//     if (!ag_abi_check(AG_VERSION_MAJOR, AG_VERSION_MINOR)) return 1;
// True when this library has their ABI: the same MAJOR, and the same MINOR while MAJOR
// is 0 (from 1.0, a MINOR no newer than the library's). Otherwise reports one line
// naming both versions, through the error handler, and returns false.
bool ag_abi_check(int major, int minor);

// ---- Errors -----------------------------------------------------------------
// Two kinds of failure, handled differently:
//
// 1. Programming errors (wrong shapes, dtype mismatches, out-of-range indices)
//    are reported through the error handler with one line that names the op
//    and the shapes, e.g.
//        attograd: matmul: inner dimensions differ: [4,8] x [7,3]
//    The default handler prints that line to stderr and calls abort(). A
//    handler you install may instead record the message and return (or
//    longjmp); when it returns, the failing function returns NULL (or does
//    nothing), and any op given a NULL input reports again and returns NULL.
//    It is called on the thread that failed, which may be one of attograd's
//    workers, and by several at once (the slices of a data-parallel step):
//    a handler that records must be thread-safe. One that longjmps must not jump
//    out of a data-parallel step: on a worker there is no jmp_buf of that thread
//    to jump to, and on the calling thread the jump would leave the step's other
//    slices running on memory given back, and the thread pool held for good. In a
//    loss function, let the handler return: the step then returns NaN.
//
// 2. Failures on user data (files, datasets) never go through the handler:
//    those functions return a nonzero code or NULL and fill an ag_err.
//
// Either message is one line: a control byte in a name or a path it quotes (a newline,
// a tab, an escape sequence) is written as a C escape ("\n", "\x1b"), as are the names
// in ag_tensor_print's and ag_tape_print's lines.
typedef void (*ag_error_handler)(const char *message, void *user);

// Installs `h` (NULL restores the default); returns the previous handler.
ag_error_handler ag_error_handler_set(ag_error_handler h, void *user);

// Reports a programming error: formats like printf, prefixes nothing (the
// handler receives e.g. "matmul: inner dimensions differ: [4,8] x [7,3]").
void ag_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
// The same with the arguments in a va_list, as vprintf is to printf: for a function of
// your own that takes a format and reports through the handler (ag_dist_abort does).
void ag_verror(const char *fmt, va_list ap)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 0)))
#endif
    ;

// A readable message for a failure on user data.
typedef struct ag_err {
    char msg[512];
} ag_err;

// ---- Memory accounting --------------------------------------------------------
// Every heap allocation attograd makes goes through one allocator (64-byte
// aligned, because aligned rows make the BLAS kernels measurably faster), and
// is counted here. Tests use the counters to prove that a repeated training
// step allocates nothing. They count the process's: every thread's allocations.
typedef struct ag_memory_stats {
    uint64_t allocations;  // calls that obtained memory, since program start
    uint64_t frees;
    size_t bytes_live;     // currently allocated
    size_t bytes_peak;
} ag_memory_stats;

ag_memory_stats ag_memory_usage(void);

// The most bytes attograd takes for one thing: a tensor's data, a tape allocation, a
// parameter store's buffer, a KV cache's keys. 2^48 (256 TiB) on a 64-bit system, more
// than the address space a process gets there (x86-64 and arm64 give it 2^47 or 2^48),
// so no shape that could exist is refused; 2^30 on a 32-bit one. Every size computed
// from a shape or a count is checked against it before anything is allocated: a shape
// whose bytes exceed it (or would wrap computing them) is refused with one line naming
// the function and the shape, e.g.
//     tensor_zeros: f32 [1073741824,1073741824,4] is too large: more than the 2^48 bytes
//     one tensor may hold
#define AG_MAX_BYTES ((size_t)1 << (SIZE_MAX > 0xFFFFFFFFu ? 48 : 30))

// ---- Threads ------------------------------------------------------------------
// attograd owns the threading policy: OpenBLAS is always asked for one
// thread, and attograd splits large work (over batch x head, or over rows of
// a large product) across its own pool of `n` threads. Small work stays on the
// calling thread, so two threads are never slower than one. A worker that
// finishes a job watches for the next one for up to 500 microseconds (a
// bounded spin that yields the core to any other runnable thread), because
// waking a sleeping thread costs more than the gap between a step's jobs;
// then it sleeps. Default: 1. Results are bit-identical for a given
// thread count. Set it between jobs: from inside one (a data-parallel loss
// function) it is an error, and the count stays; so is a count below 1. A
// count above 64 is taken as 64.
//
// Threads of your own may use attograd at once, each with its own tapes, tensors,
// parameter stores, optimizers, KV caches, generators and data-parallel objects: each
// gets the bits it gets alone (tests/test_user_threads.c). One of those objects may not be
// used by two threads at once. Their jobs take turns on the one pool. The thread count
// and the error handler are the process's: any thread may set them, and the others'
// next jobs and errors follow (a data-parallel step reads the count as it starts).
void ag_threads_set(int n);
int ag_threads(void);

#ifdef __cplusplus
}
#endif
#endif
