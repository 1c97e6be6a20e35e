// Shared by the module files: composing PyTorch-style parameter names.
#ifndef ATTOGRAD_NN_INTERNAL_H
#define ATTOGRAD_NN_INTERNAL_H

#include "../core/internal.h"
#include "attograd/nn.h"
#include "attograd/ops.h"

#define AGI_NAME_MAX 256

// An op the modules use that is not public (src/ops/append_row.c):
// x [B, S, E] -> [B, S+1, E], the last position `row` (E elements) or zeros when row is
// NULL; both x and row receive gradients (nn.MultiheadAttention's add_bias_kv and
// add_zero_attn).
ag_tensor *agi_append_row(ag_tape *tp, ag_tensor *x, ag_tensor *row);

// out = prefix + name ("layers.0." + "norm1.weight"); false (after reporting)
// if it does not fit.
bool agi_join_name(char out[AGI_NAME_MAX], const char *prefix, const char *name);

#endif
