// A kernel that runs only on CPUs with some instructions, and that can be switched off:
// by an environment variable (NAME=0), or by a test comparing it with its fallback.
#ifndef ATTOGRAD_CPU_SWITCH_H
#define ATTOGRAD_CPU_SWITCH_H

#include <stdatomic.h>
#include <stdbool.h>

typedef struct {
    atomic_int state;        // 0: not decided yet, 1: on, 2: off
    const char *env;         // the environment variable that switches it off with "0"
    bool (*cpu_has)(void);   // whether this CPU runs it
} agi_cpu_switch;

// On: the CPU runs it, and neither the environment nor agi_cpu_switch_set turned it off.
bool agi_cpu_switch_on(agi_cpu_switch *s);
// Off, or back to on if the CPU runs it.
void agi_cpu_switch_set(agi_cpu_switch *s, bool on);

#endif
