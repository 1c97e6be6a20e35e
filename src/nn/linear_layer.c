// torch.nn.Linear: y = x W^T + b, with PyTorch's initialisation.
#include <math.h>
#include <string.h>

#include "nn.h"

static bool init_parts(ag_linear_layer *l, ag_params *ps, const char *name, int in, int out,
                       bool bias, ag_pcg32 *rng) {
    char full[AGI_NAME_MAX];
    if (!agi_given(l, "linear_layer_init", "layer") || !agi_given(rng, "linear_layer_init", "rng"))
        return false;
    memset(l, 0, sizeof *l);
    if (!agi_module_name_ok("linear_layer_init", name) || !agi_join_name(full, name, "weight"))
        return false;
    l->weight = ag_params_add(ps, full, 2, (int[]){out, in});
    if (!l->weight) return false;
    // kaiming_uniform(a = sqrt 5) gives U(-1/sqrt(in), 1/sqrt(in)), as does the bias.
    ag_tensor_init_kaiming_uniform(l->weight, rng, sqrt(5.0));
    if (bias) {
        if (!agi_join_name(full, name, "bias")) return false;
        l->bias = ag_params_add(ps, full, 1, (int[]){out});
        if (!l->bias) return false;
        double bound = 1.0 / sqrt((double)in);
        ag_tensor_init_uniform(l->bias, rng, -bound, bound);
    }
    return true;
}

bool ag_linear_layer_init(ag_linear_layer *l, ag_params *ps, const char *name, int in, int out,
                          bool bias, ag_pcg32 *rng) {
    const agi_init_undo u = agi_init_begin(ps, rng);
    const bool ok = init_parts(l, ps, name, in, out, bias, rng);
    return agi_init_end(&u, ok, l, l ? sizeof *l : 0);
}

ag_tensor *ag_linear_layer_forward(ag_tape *tp, const ag_linear_layer *l, ag_tensor *x) {
    if (!agi_given(l, "linear_layer_forward", "layer")) return NULL;
    return ag_linear(tp, x, l->weight, l->bias);
}
