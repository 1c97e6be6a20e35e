// An SVG picture of every head's attention weights on one sequence.
#ifndef COPY_TASK_HEATMAP_H
#define COPY_TASK_HEATMAP_H

#include <attograd.h>

#include "seqdata.h"

// weights[l]: layer l's weights [1, h, T, S]; query_tokens: T ids labelling
// the rows, key_tokens: S ids labelling the columns (characters from d).
// Returns false with err filled if the file cannot be written; the file is then as it
// was (an earlier run's picture stays whole).
bool heatmap_write(const char *path, const char *title, ag_tensor *const weights[], int layers,
                   const int32_t *query_tokens, const int32_t *key_tokens,
                   const ag_seqdata *d, ag_err *err);

#endif
