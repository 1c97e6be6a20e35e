// Shared by the module files: composing PyTorch-style parameter names.
#ifndef ATTOGRAD_NN_INTERNAL_H
#define ATTOGRAD_NN_INTERNAL_H

#include "../core/internal.h"
#include "attograd/nn.h"
#include "attograd/ops.h"

#define AGI_NAME_MAX 256

// out = prefix + name ("layers.0." + "norm1.weight"); false (after reporting)
// if it does not fit.
bool agi_join_name(char out[AGI_NAME_MAX], const char *prefix, const char *name);

#endif
