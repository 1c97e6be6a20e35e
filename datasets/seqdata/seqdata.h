// seqdata.h — synthetic sequence tasks for attention models: generate them
// from a pcg32 seed, save and load them as readable text files, and cut them
// into next-token training batches.
//
// Example support, not autograd: this is the attograd_seqdata library
// (datasets/seqdata/), which the examples, benchmarks and tests link beside
// attograd; libattograd itself holds no dataset code.
//
// Three tasks. A sequence is a row of token ids; each task fixes its alphabet,
// and a token's id is the position of its character in the alphabet:
//
//   copy     x1 .. xL | x1 .. xL            alphabet "0123456789|"
//   reverse  x1 .. xL | xL .. x1            alphabet "0123456789|"
//   recall   k1 v1 .. kn vn | kq vq         alphabet "0123456789|abcdefghijklmnop"
//
// x are symbols 0-9; recall's keys k are letters a-p, all different within a
// sequence, its values v are digits 0-9, kq is one of the keys and vq the value
// stored with it. The separator '|' is token 10 in every task, and the digits
// are tokens 0-9, so printed ids read like the file.
//
// A causal next-token model reads s[0 .. N-2] and predicts s[1 .. N-1]. It is
// scored only where the answer is determined by what came before: the second
// half of copy and reverse (L targets, chance 10%), and vq in recall (one
// target). Copy and reverse need attention L+1 positions back; recall needs a
// lookup by content (find the earlier kq, read the token after it), which a
// single causal attention layer cannot do and two can.
//
// The committed datasets (datasets/<task>/{train,valid,test}.txt) and their
// file format are described in datasets/README.md; ag_seqdata_make_standard
// regenerates them byte for byte.
#ifndef ATTOGRAD_SEQDATA_H
#define ATTOGRAD_SEQDATA_H

#include <stdbool.h>
#include <stdint.h>

#include "attograd/base.h"
#include "attograd/ops.h"  // AG_IGNORE_INDEX
#include "attograd/random.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ag_task { AG_TASK_COPY = 0, AG_TASK_REVERSE = 1, AG_TASK_RECALL = 2 } ag_task;

// "copy", "reverse", "recall"; "?" for a value outside the enum.
const char *ag_task_name(ag_task t);
// Sets *out and returns 0 for a known name; returns -1 otherwise.
int ag_task_from_name(const char *name, ag_task *out);

// The task's size parameter, `length`: the number of symbols L in each half
// for copy and reverse (1 to AG_SEQ_MAX_LENGTH), the number of key-value pairs
// n for recall (1 to AG_SEQ_MAX_PAIRS, the number of distinct keys).
#define AG_SEQ_MAX_LENGTH 1024
#define AG_SEQ_MAX_PAIRS 16
// The most sequences one dataset (or file) may hold.
#define AG_SEQ_MAX_COUNT (1 << 24)

// A dataset: `count` sequences of `seq_len` tokens, all of one task and size.
// Fields are for reading; the tokens may be read freely and must keep the
// task's invariants if you change them (ag_seqdata_save checks).
//
// Layout of one sequence s (the numbers are for copy with L = 16 and for
// recall with n = 8):
//   s[0 .. source_len-1]          the source: x1..xL (16) / k1 v1 .. kn vn (16)
//   s[source_len]                 the separator
//   s[source_len+1 .. seq_len-1]  the target part, target_len tokens:
//                                 the copy (16) / kq vq (2)
//   s[scored_from .. seq_len-1]   the tokens a model is scored on: the whole
//                                 target part for copy and reverse
//                                 (scored_from = 17), only vq for recall
//                                 (scored_from = 18)
typedef struct ag_seqdata {
    ag_task task;
    int length;            // L for copy/reverse, n for recall (see above)
    int count;             // number of sequences
    int seq_len;           // tokens per sequence: 2L+1 (copy, reverse), 2n+3 (recall)
    int vocab;             // token ids are 0 .. vocab-1 (11 for copy/reverse, 27 for recall)
    int sep_token;         // the separator's id (10)
    int source_len;        // tokens before the separator, which sits at s[source_len]
    int target_len;        // tokens after the separator: seq_len - source_len - 1
    int scored_from;       // s[scored_from ..] are the scored tokens
    const char *alphabet;  // alphabet[id] is the character of token id (vocab chars)
    bool has_seed;         // true if the sequences are ag_seqdata_generate(task, length,
    uint64_t seed;         //   count, seed, stream) in order; otherwise false and the
    uint64_t stream;       //   two are 0. Shuffling clears them.
    int32_t *tokens;       // [count, seq_len], row i is sequence i
} ag_seqdata;

// `count` sequences drawn from pcg32 (seed, stream); the same arguments give
// the same tokens on every platform. Reports an error and returns NULL for a
// bad task, length or count.
ag_seqdata *ag_seqdata_generate(ag_task task, int length, int count, uint64_t seed,
                                uint64_t stream);
void ag_seqdata_free(ag_seqdata *d);

// Sequence i: seq_len tokens (i in [0, count)).
const int32_t *ag_seqdata_seq(const ag_seqdata *d, int i);

// ---- Batches ---------------------------------------------------------------------
// Next-token pairs for sequences [first, first + B), N = seq_len:
//   inputs:  [B, N-1], inputs[b][t]  = s[t]
//   targets: [B, N-1], targets[b][t] = s[t+1] if t+1 >= scored_from, else
//            AG_IGNORE_INDEX
// For copy with L = 16: 32 positions, of which the last 16 are scored (the
// separator's position predicts x1, ..., the position of the copy's x(L-1)
// predicts xL).
void ag_seqdata_batch(const ag_seqdata *d, int first, int B, int32_t *inputs, int32_t *targets);

// The same sequences split for an encoder-decoder, T = target_len:
//   source:  [B, source_len], the tokens before the separator (encoder input)
//   dec_in:  [B, T], s[source_len .. seq_len-2]: the separator, then the target
//            part shifted right (decoder input; the separator acts as BOS)
//   dec_tgt: [B, T], s[source_len+1 ..], with AG_IGNORE_INDEX where not scored
// For copy: dec_in = | x1..x(L-1), dec_tgt = x1..xL. For recall:
// dec_in = | kq, dec_tgt = (ignored) vq.
void ag_seqdata_batch_seq2seq(const ag_seqdata *d, int first, int B, int32_t *source,
                              int32_t *dec_in, int32_t *dec_tgt);

// Permutes the sequences uniformly at random (Fisher-Yates driven by rng), for
// a new batch order each epoch. Clears has_seed, seed and stream.
void ag_seqdata_shuffle(ag_seqdata *d, ag_pcg32 *rng);

// How many sequences of b also occur in a (as identical token rows); 0 when
// the sequence lengths differ. Used to prove that test data never appears in
// training data.
int ag_seqdata_count_shared(const ag_seqdata *a, const ag_seqdata *b);

// ---- Tokens and characters ---------------------------------------------------
// The character of token id (for printing and for labelling heatmaps); '?'
// for an id outside the vocabulary, '_' for AG_IGNORE_INDEX.
char ag_seqdata_char(const ag_seqdata *d, int32_t id);
// The id of character c, or -1 if c is not in the alphabet.
int32_t ag_seqdata_token(const ag_seqdata *d, char c);

// ---- Files -------------------------------------------------------------------------
// The format (one header, then one sequence per line in the alphabet's
// characters) is specified in datasets/README.md. On failure save returns
// nonzero and load returns NULL, and both fill *err (if err is not NULL) with
// one line naming the file, and for load the line number and the problem:
//     datasets/copy/train.txt:20: column 20: second half differs from the
//     first: '4' where the copy has '3'
// Neither aborts or crashes on bad input.
//
// save refuses a dataset whose sequences break the task's invariants, and
// replaces `path` atomically: it writes a temporary file next to it, flushes
// it to disk and renames it over `path`, so `path` is never half-written; a
// failed save leaves the previous file as it was and removes its temporary
// ("<path>.tmp.<pid>.<n>", which only a crash can leave behind).
int ag_seqdata_save(const ag_seqdata *d, const char *path, ag_err *err);
// Validates everything: the header, the count, every character, every line's
// length and the task's invariants (copy halves equal, reverse reversed,
// recall keys distinct and the answer right). Lines may end in LF or CRLF.
ag_seqdata *ag_seqdata_load(const char *path, ag_err *err);
// The same, for a file that must hold `task`: a file of another task (a
// recall file saved as copy/valid.txt) is refused with one line naming the
// file and both tasks, before anything downstream sees its tokens.
ag_seqdata *ag_seqdata_load_task(const char *path, ag_task task, ag_err *err);

// ---- The committed datasets -----------------------------------------------------------
// Writes dir/<task>/{train,valid,test}.txt for copy, reverse (L = 16) and
// recall (n = 8), creating dir and its task directories if missing (not
// dir's parents); the result is
// byte-identical to the files committed under datasets/. Every split has its
// own pcg32 stream, and the function fails (without writing anything) if a
// sequence of one split occurs in another.
int ag_seqdata_make_standard(const char *dir, ag_err *err);

#ifdef __cplusplus
}
#endif
#endif
