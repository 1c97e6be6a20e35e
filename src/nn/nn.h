// Shared by the module files: composing PyTorch-style parameter names.
#ifndef ATTOGRAD_NN_INTERNAL_H
#define ATTOGRAD_NN_INTERNAL_H

#include "../core/internal.h"
#include "attograd/nn.h"
#include "attograd/ops.h"

#define AGI_NAME_MAX 256

// Whether `name` may name a module (module_name.c): NULL or "" (the root), or
// dot-separated components, none empty. Reports "<op>: module name ..." otherwise.
bool agi_module_name_ok(const char *op, const char *name);
// out = module + "." + member ("layers.0" and "norm1.weight" give
// "layers.0.norm1.weight"), or member alone for the root module (NULL or "");
// false (after reporting) if it does not fit.
bool agi_join_name(char out[AGI_NAME_MAX], const char *module, const char *member);

#endif
