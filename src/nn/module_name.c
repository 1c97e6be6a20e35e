// Module names, as torch.nn.Module.state_dict makes them: a module called "head" owns
// "head.weight" and "head.bias"; a module inside it is "head.proj", its tensors
// "head.proj.weight". The root module has no name (NULL or ""), and its tensors are
// named by themselves. A name is dot-separated components, none empty: "head." or
// "a..b" would make names PyTorch never makes, and a checkpoint that fails a strict load.
#include <stdio.h>
#include <string.h>

#include "nn.h"

bool agi_module_name_ok(const char *op, const char *name) {
    if (!name || !*name) return true;
    const size_t n = strlen(name);
    if (name[n - 1] == '.') {
        ag_error("%s: module name '%s' ends in '.': pass the module's own name, as "
                 "state_dict makes it (\"head\" owns head.weight and head.bias)",
                 op, name);
        return false;
    }
    if (name[0] == '.' || strstr(name, "..")) {
        ag_error("%s: module name '%s' has an empty component (\"layers.0\" owns "
                 "layers.0.linear1.weight)",
                 op, name);
        return false;
    }
    return true;
}

bool agi_join_name(char out[AGI_NAME_MAX], const char *module, const char *member) {
    const bool root = !module || !*module;
    int n = snprintf(out, AGI_NAME_MAX, "%s%s%s", root ? "" : module, root ? "" : ".", member);
    if (n < 0 || n >= AGI_NAME_MAX) {
        ag_error("params: name '%s%s%s' is longer than %d characters", root ? "" : module,
                 root ? "" : ".", member, AGI_NAME_MAX - 1);
        return false;
    }
    return true;
}
