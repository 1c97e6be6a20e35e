// torch.nn.LayerNorm over the last dim, with affine weight (ones) and bias (zeros).
#include <string.h>

#include "nn.h"

static bool init_parts(ag_layernorm_layer *l, ag_params *ps, const char *name, int dim) {
    char full[AGI_NAME_MAX];
    if (!agi_given(l, "layernorm_layer_init", "layer")) return false;
    memset(l, 0, sizeof *l);
    l->eps = 1e-5;
    if (!agi_module_name_ok("layernorm_layer_init", name) ||
        !agi_join_name(full, name, "weight"))
        return false;
    l->weight = ag_params_add(ps, full, 1, (int[]){dim});
    if (!l->weight || !agi_join_name(full, name, "bias")) return false;
    l->bias = ag_params_add(ps, full, 1, (int[]){dim});
    if (!l->bias) return false;
    ag_tensor_fill(l->weight, 1.0);
    return true;
}

bool ag_layernorm_layer_init(ag_layernorm_layer *l, ag_params *ps, const char *name, int dim) {
    const agi_init_undo u = agi_init_begin(ps, NULL);
    const bool ok = init_parts(l, ps, name, dim);
    return agi_init_end(&u, ok, l, l ? sizeof *l : 0);
}

ag_tensor *ag_layernorm_layer_forward(ag_tape *tp, const ag_layernorm_layer *l, ag_tensor *x) {
    if (!agi_given(l, "layernorm_layer_forward", "layer")) return NULL;
    return ag_layernorm(tp, x, l->weight, l->bias, l->eps);
}
