// The one clock: how long a node, a check or a wait took (monotonic, so a change of the
// wall clock never shows as a duration).
#define _POSIX_C_SOURCE 200809L  // clock_gettime
#include <time.h>

#include "internal.h"

double agi_seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
