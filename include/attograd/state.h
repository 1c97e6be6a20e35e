// attograd/state.h — training state kept beside a parameter store (an
// optimizer's), described so that a checkpoint can save and restore it
// without knowing what it is.
//
// The state is a kind name ("adam"), settings as key/value strings
// ("step" = "1000", "lr" = "0.001", "no_decay" = "[\"l1.bias\"]"), and named
// flat buffers ("exp_avg"), each laid out as the store's value buffer: a
// parameter's state starts at the same element offset as its value. The state
// alone knows what its settings mean and how they are written; a checkpoint
// stores the strings and hands them back. An optimizer hands out its
// description (ag_optim_state in optim.h); the checkpoint functions (io.h)
// take one.
#ifndef ATTOGRAD_STATE_H
#define ATTOGRAD_STATE_H

#include "attograd/params.h"

#ifdef __cplusplus
extern "C" {
#endif

// The settings read back from a file.
typedef struct ag_state_source {
    // A key's value (the key as the state names it, "step"), NULL if absent.
    const char *(*get)(const void *ctx, const char *key);
    const void *ctx;
    // How the file spells the keys, for messages: "optimizer." + "step".
    const char *prefix;
    // One flag a buffer (n_buffers of them), all false when restore is called:
    // restore sets may_lack[i] when the file's settings say that buffer i had not
    // been made yet (PyTorch makes SGD's momentum_buffer on the first step, and
    // its state_dict holds no buffer at all before it). The file may then leave
    // out all of that buffer's tensors, and the buffer loads as zeros. NULL when
    // the caller does not ask.
    bool *may_lack;
} ag_state_source;

typedef struct ag_state {
    void *self;
    // Saved as the file's kind and compared on load: "sgd", "adam", ...
    const char *(*kind)(const void *self);
    // The store the buffers mirror, and each buffer's length in elements (the
    // store's buffer length when the state was made; a store that has grown
    // since no longer matches), or 0 when the state knows that its buffers no
    // longer line up with the store at that same length (a parameter resized
    // inside its padding): a checkpoint then refuses the state.
    const ag_params *(*store)(const void *self, size_t *buffer_len);
    // Setting i of n_values (which may change as the state does: a setting can be
    // left out while it has its default). value sets *key and returns the length of
    // the value, which it writes, NUL-terminated, into buf only when it fits (length
    // < size): a caller whose buf was too small asks again with length + 1 bytes.
    int (*n_values)(const void *self);
    size_t (*value)(const void *self, int i, const char **key, char *buf, size_t size);
    // Buffer i of n_buffers, in the store's dtype.
    int (*n_buffers)(const void *self);
    const char *(*buffer_name)(const void *self, int i);
    void *(*buffer_data)(const void *self, int i);
    // Reads and checks every setting from `src` (an absent one as the state
    // decides: an error, or its default); only when all of them are good and
    // `apply` is true, sets them. Returns 0, or -1 with one line in err (naming
    // the key as the file spells it). A checkpoint calls it once to check,
    // before it writes anything, and once to apply.
    int (*restore)(void *self, const ag_state_source *src, bool apply, ag_err *err);
} ag_state;

#ifdef __cplusplus
}
#endif
#endif
