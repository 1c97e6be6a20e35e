// Byte-level text for language models: a file (or every regular file of a
// directory, in name order) read into one buffer, split into training text
// (the first part) and validation text (the rest), random windows of it as
// next-byte batches, and the unigram and bigram baselines a model must beat.
#ifndef EXAMPLES_TEXT_H
#define EXAMPLES_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <attograd.h>

typedef struct {
    uint8_t *bytes;
    size_t len;
    size_t train_len;  // training text: [0, train_len); validation: [train_len, len)
} text_data;

// Reads `path` (a file, or a directory whose regular files are concatenated in
// name order; symbolic links are skipped, so an alias is not read twice) and
// keeps the last `valid_fraction` for validation. Each split must hold at
// least `min_split` bytes. Returns false with one line in err on a missing,
// unreadable or too small input.
bool text_load(text_data *t, const char *path, double valid_fraction, size_t min_split,
               ag_err *err);
void text_free(text_data *t);

// B windows of T + 1 bytes at offsets drawn from rng, from the training or the
// validation text: ids[b*T + i] = text[s + i], targets[b*T + i] = text[s + i + 1].
void text_windows(const text_data *t, bool valid, int B, int T, ag_pcg32 *rng, int32_t *ids,
                  int32_t *targets);

// Validation bits per byte of the models "next byte ~ its training frequency"
// (unigram) and "next byte ~ its frequency after the previous byte" (bigram),
// counted on the training text with add-alpha smoothing (alpha = 0.1 over 256
// byte values).
double text_unigram_bits(const text_data *t);
double text_bigram_bits(const text_data *t);

// Prints the text's size and split, and the baselines' validation bits per byte.
void text_print_summary(const text_data *t, const char *path);

#endif
