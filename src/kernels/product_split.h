// How a product large enough is cut over attograd's threads: one definition for the
// kernels that pack their operands into panels (tile_gemm.c in float32 and float64,
// bf16_gemm.c), which differ only in what a panel holds and how a block of C is computed.
#ifndef ATTOGRAD_PRODUCT_SPLIT_H
#define ATTOGRAD_PRODUCT_SPLIT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct agi_product_split agi_product_split;

// A product C[M, N] += op(A) op(B) as a kernel describes it. A kernel's own description
// of the product starts with this struct, so that its callbacks get it back.
struct agi_product_split {
    // Set by the kernel.
    int M, N, K;
    int mr, nr;    // the register tile: slices are whole tiles, MR rows or NR columns
    bool pack_a;   // op(A) is packed (a slice of columns would pack all of it again)
    bool pack_b;   // op(B) is packed
    // op(A), though pack_a is false (a product's slices of rows pack their own rows), is
    // copied once for all slices of columns into a_packed by pack_a_panels (laid out as
    // the kernel says), which would each pack all of it again.
    bool share_a;
    size_t a_bytes, b_bytes;  // all of op(A), all of op(B) packed, every chunk of k
    // The rows a slice of rows needs to pack its own blocks of op(B) instead of sharing
    // one packing of all of it (INT_MAX: always shared).
    int own_b_min_rows;
    // C[m0:m1, n0:n1] (m0, m1 multiples of mr and n0, n1 of nr but at the ends), its
    // operands read from a_packed / b_packed where those are not NULL.
    void (*part)(const agi_product_split *s, int m0, int m1, int n0, int n1);
    // Panels [begin, end) of op(A) (rows begin mr ..) into a_packed, every chunk of k;
    // and of op(B) (columns begin nr ..) into b_packed.
    void (*pack_a_panels)(const agi_product_split *s, int begin, int end);
    void (*pack_b_panels)(const agi_product_split *s, int begin, int end);
    // Set by agi_product_run: the split, and the operands packed once for all slices.
    bool by_rows;
    void *a_packed, *b_packed;
};

// Computes the product, `work` its flops: on the calling thread when agi_parallel_threads
// says 1, else in slices of whole tiles over the threads (product_split.c says which way
// and what is packed once for all). part() must give the same bits whatever the slices.
void agi_product_run(agi_product_split *s, double work);

#endif
