// torch.nn.Embedding: a table of rows, initialised N(0, 1).
#include <string.h>

#include "nn.h"

static bool init_parts(ag_embedding_layer *l, ag_params *ps, const char *name, int num,
                       int dim, ag_pcg32 *rng) {
    char full[AGI_NAME_MAX];
    if (!agi_given(l, "embedding_layer_init", "layer") ||
        !agi_given(rng, "embedding_layer_init", "rng"))
        return false;
    memset(l, 0, sizeof *l);
    if (!agi_module_name_ok("embedding_layer_init", name) ||
        !agi_join_name(full, name, "weight"))
        return false;
    l->weight = ag_params_add(ps, full, 2, (int[]){num, dim});
    if (!l->weight) return false;
    ag_tensor_init_normal(l->weight, rng, 0.0, 1.0);
    return true;
}

bool ag_embedding_layer_init(ag_embedding_layer *l, ag_params *ps, const char *name, int num,
                             int dim, ag_pcg32 *rng) {
    const agi_init_undo u = agi_init_begin(ps, rng);
    const bool ok = init_parts(l, ps, name, num, dim, rng);
    return agi_init_end(&u, ok, l, l ? sizeof *l : 0);
}

ag_tensor *ag_embedding_layer_forward(ag_tape *tp, const ag_embedding_layer *l,
                                      const int32_t *ids, int ndim, const int shape[]) {
    return ag_embedding(tp, l ? l->weight : NULL, ids, ndim, shape);
}
