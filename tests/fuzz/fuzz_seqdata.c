// libFuzzer target for the dataset loader (ag_seqdata_*): any text must
// either load into a dataset that keeps its task's invariants or fail with
// one line naming the file and the line; never crash, leak or hit undefined
// behaviour. A dataset that loads saves and loads back to the same tokens.
// Seeded with the committed datasets. See tests/fuzz/README.md.
#include "fuzz_common.h"

// The dataset API's header: in the library here, beside the datasets
// (datasets/seqdata/seqdata.h) once branch floors moves it out.
#if __has_include("attograd/data.h")
#include "attograd/data.h"
#else
#include "seqdata.h"
#endif

#define TARGET "fuzz_seqdata"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("data.txt", data, size);
    ag_err err = {{0}};
    ag_seqdata *d = ag_seqdata_load(path, &err);
    if (!d) {
        fuzz_check_message(TARGET, &err, path);
        return 0;
    }
    fuzz_require(d->count >= 1 && d->seq_len >= 1 && d->vocab >= 1, TARGET, "empty dataset");
    fuzz_require((size_t)d->count * (size_t)d->seq_len <= size, TARGET, "more tokens than bytes");
    for (int i = 0; i < d->count; i++) {
        const int32_t *s = ag_seqdata_seq(d, i);
        for (int t = 0; t < d->seq_len; t++)
            fuzz_require(s[t] >= 0 && s[t] < d->vocab, TARGET, "token outside the vocabulary");
        fuzz_require(s[d->source_len] == d->sep_token, TARGET, "no separator");
    }
    // A loaded dataset is a valid one: it saves, and loads back unchanged.
    const char *copy = fuzz_path("copy.txt");
    fuzz_require(ag_seqdata_save(d, copy, &err) == 0, TARGET, "a loaded dataset does not save");
    ag_seqdata *again = ag_seqdata_load(copy, &err);
    fuzz_require(again && again->count == d->count && again->seq_len == d->seq_len &&
                     again->task == d->task,
                 TARGET, "the saved copy does not load back");
    fuzz_require(memcmp(again->tokens, d->tokens,
                        sizeof(int32_t) * (size_t)d->count * (size_t)d->seq_len) == 0,
                 TARGET, "the saved copy holds other tokens");
    ag_seqdata_free(again);
    ag_seqdata_free(d);
    return 0;
}
