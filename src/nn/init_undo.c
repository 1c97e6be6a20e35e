// A module's init is all or nothing. One that fails part-way (a name already in the
// store, buffers beyond their limit) takes back the parameters it added and restores the
// generator's state, so that a retry under another name makes what a first try would
// have, and no orphan parameter is trained, clipped or saved with the model.
#include <string.h>

#include "nn.h"

agi_init_undo agi_init_begin(ag_params *ps, ag_pcg32 *rng) {
    agi_init_undo u = {ps, agi_params_mark(ps), rng, {0}};
    if (rng) u.rng_at = *rng;
    return u;
}

bool agi_init_end(const agi_init_undo *u, bool ok, void *module, size_t size) {
    if (ok) return true;
    agi_params_truncate(u->ps, u->count);
    if (u->rng) *u->rng = u->rng_at;
    if (module) memset(module, 0, size);
    return false;
}
