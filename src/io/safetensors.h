// The in-memory tensor set behind ag_safetensors, shared by the files that
// build it (safetensors.c), read it (safetensors_load.c), write it
// (safetensors_save.c), fill parameter stores from it (params_io.c) and make
// checkpoints of it (checkpoint.c).
#ifndef ATTOGRAD_IO_SAFETENSORS_H
#define ATTOGRAD_IO_SAFETENSORS_H

#include "../core/internal.h"
#include "attograd/io.h"

typedef struct agi_st_entry {
    char *name;
    ag_tensor tensor;  // .name is `name`; bookkeeping 0, so ag_tensor_free leaves it alone
    bool borrowed;     // .data belongs to someone else (checkpoints are written in place)
} agi_st_entry;

typedef struct agi_st_meta {
    char *key, *value;
} agi_st_meta;

struct ag_safetensors {
    agi_st_entry **entries;  // sorted by name (strcmp); each allocated once, never moved
    int count, cap;
    agi_st_meta *meta;       // sorted by key
    int meta_count, meta_cap;
};

// Adds `name` with t's shape and dtype, copying the values or, when `borrow`,
// pointing at t's data (which must outlive the set).
int agi_st_add(ag_safetensors *st, const char *name, const ag_tensor *t, bool borrow,
               ag_err *err);

// The format's dtypes (safetensors.c holds their one table). The position of a stored
// dtype in the reference implementation's Dtype enum, which the writer sorts by, or -1
// for one attograd does not store; a name read from a file: 1 and *dt set for a dtype
// attograd stores, 0 for another dtype of the format, -1 for a name the format lacks;
// and the stored ones, listed for a message ("BOOL, U8, ... and I64"). Returns buf.
int agi_st_dtype_rank(ag_dtype dt);
int agi_st_dtype_from_name(const char *s, ag_dtype *dt);
const char *agi_st_stored_dtypes(char *buf, size_t size);

// A name made safe for a one-line message: control characters escaped as
// \xNN, long names shortened with "...". Returns buf.
const char *agi_st_show(const char *s, char *buf, size_t size);

// The index of the first byte of a BOOL tensor that is neither 0 nor 1, or numel when
// there is none (or t is not BOOL). A file's BOOL bytes are 0 or 1: the loader refuses
// others, so the set refuses them too, and a saved file always loads.
size_t agi_st_first_bad_bool(const ag_tensor *t);

// Converts `count` elements of `size` bytes, in place, between host order and
// the little-endian order of files: nothing to do on little-endian hosts, a
// byte swap of each element elsewhere (the conversion is its own inverse).
void agi_le_inplace(void *data, size_t count, size_t size);

// ---- Parameter stores (params_io.c) ---------------------------------------------------

// Adds every parameter as prefix + name (copies, or views of the store when
// `borrow`), or nothing if any name is unusable.
int agi_st_add_params(ag_safetensors *st, const ag_params *ps, const char *prefix, bool borrow,
                      ag_err *err);

// The checks of ag_params_load_from, writing nothing: every parameter is in
// the set as prefix + name, F32 or F64, with its shape, and no other tensor
// starts with `prefix`, except those that start with `except` (NULL: none
// excepted). On success src[i] (one per parameter) is parameter i's tensor;
// otherwise err gets one line listing every problem.
int agi_params_match(const ag_params *ps, const ag_safetensors *st, const char *prefix,
                     const char *except, const ag_tensor **src, ag_err *err);

// err = "<path>: <msg>", ending in "..." when cut to fit.
void agi_err_in_file(ag_err *err, const char *path, const char *msg);

#endif
