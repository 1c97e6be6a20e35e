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

// Where a window starts, uniform in [0, span): the whole span, past 4 GB too.
size_t text_window_start(size_t span, ag_pcg32 *rng);
// B windows of T + 1 bytes at offsets drawn from rng, from the training or the
// validation text: ids[b*T + i] = text[s + i], targets[b*T + i] = text[s + i + 1].
void text_windows(const text_data *t, bool valid, int B, int T, ag_pcg32 *rng, int32_t *ids,
                  int32_t *targets);

// A batch of B windows as every process of a data-parallel run draws it, and the
// sequences [first, first + count) of it that process `part` of `parts` trains on
// (as even as possible: the first B % parts processes get one more): its ids and
// targets, count * T of each.
typedef struct {
    int B, T, first, count;
    int32_t *ids, *targets;             // [B, T]: the whole batch
    const int32_t *my_ids, *my_targets;  // this process's rows of them
} text_batch;

// False, with nothing allocated, when the memory for the batch cannot be had.
bool text_batch_new(text_batch *b, int B, int T, int part, int parts);
void text_batch_free(text_batch *b);
// Draws the whole batch (text_windows), so that every process draws the same.
void text_batch_draw(text_batch *b, const text_data *t, bool valid, ag_pcg32 *rng);

// Validation bits per byte of the models "next byte ~ its training frequency"
// (unigram) and "next byte ~ its frequency after the previous byte" (bigram),
// counted on the training text with add-alpha smoothing (alpha = 0.1 over 256
// byte values).
double text_unigram_bits(const text_data *t);
double text_bigram_bits(const text_data *t);

// "237320 bytes, FNV-1a hash 0123456789abcdef": what a checkpoint records of the text
// it was trained on, to tell the same text from another (static storage).
const char *text_fingerprint(const text_data *t);
// Whether t, read from `path`, is the text whose fingerprint checkpoint `ckpt` (loaded
// as `file`) recorded under "data-text". When it is not and the text was chosen on
// the command line (`chosen`), says on stdout that it trains on t and returns true;
// otherwise false with one line in err.
bool text_check_fingerprint(const text_data *t, const char *path, const ag_safetensors *file,
                            const char *ckpt, bool chosen, ag_err *err);

// Prints the text's size and split, and the baselines' validation bits per byte.
void text_print_summary(const text_data *t, const char *path);

#endif
