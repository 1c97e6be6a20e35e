// Kernels switched on by what the CPU runs (cpu_switch.h).
#include "cpu_switch.h"

#include <stdlib.h>
#include <string.h>

bool agi_cpu_switch_on(agi_cpu_switch *s) {
    int state = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (state == 0) {
        const char *env = getenv(s->env);
        state = s->cpu_has() && !(env && strcmp(env, "0") == 0) ? 1 : 2;
        atomic_store_explicit(&s->state, state, memory_order_relaxed);
    }
    return state == 1;
}

void agi_cpu_switch_set(agi_cpu_switch *s, bool on) {
    atomic_store(&s->state, 0);
    if (!on || !agi_cpu_switch_on(s)) atomic_store(&s->state, 2);
}
