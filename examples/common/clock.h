// The examples' one clock: seconds on a monotonic clock, for progress lines, rates and
// the time a run spends (differences between two readings; the origin means nothing).
#ifndef EXAMPLES_CLOCK_H
#define EXAMPLES_CLOCK_H

double now_seconds(void);

#endif
