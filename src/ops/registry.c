// The table of the op registry (registry.h), and each f32 op's f64 twin from it:
// ag_tape_check checks an f32 node through the same op in f64 (src/ops/tape_check.c).
// The typed sources define both variants from one text (src/core/real.h), so the twin
// runs the same arithmetic.
#include "registry.h"

#include <string.h>

#define ENTRY(name, torch) {#name, &agi_##name##_op_f32, &agi_##name##_op_f64, torch},
const agi_op_entry agi_ops[] = {AGI_OPS(ENTRY)};
const int agi_n_ops = (int)(sizeof agi_ops / sizeof agi_ops[0]);

const agi_op_entry *agi_op_find(const char *name) {
    for (int i = 0; name && i < agi_n_ops; i++)
        if (strcmp(agi_ops[i].name, name) == 0) return &agi_ops[i];
    return NULL;
}

const ag_op *agi_op_f64(const ag_op *op) {
    for (int i = 0; i < agi_n_ops; i++)
        if (agi_ops[i].f32 == op) return agi_ops[i].f64;
    return NULL;
}
