// How a packed product is cut over the threads (product_split.h).
//
// Along the columns, each slice packs only its own columns of op(B) into its core's L2 and
// streams all the rows of op(A) past them: op(A) read in place (a tile of columns a slice
// at the least: a small product, an attention block, then needs no job of packing first),
// or, when op(A) is packed, from panels all the threads packed together beforehand. Along
// the rows when there are too few columns to go round, and when op(A) is packed and has
// more rows than op(B) has columns (dW of a layer that widens: a slice of columns would
// stream all of the tall op(A) for a few tiles). A slice of rows packs its own blocks of
// op(B) when it has rows enough to repay the copy (the kernel says how many: in float32
// no job of packing first, as fast as a shared copy on the dW products; bf16's packing,
// which rounds, costs too much to repeat in every slice), else op(B) is packed once for
// all. Slices of rows streaming a shared packed op(B) past a few panels each ran far
// slower than by columns (bench/README.md has the measurements).
#include "product_split.h"

#include "../core/parallel.h"
#include "scratch.h"

// The most memory an operand is packed into once for all slices (above it, each slice
// packs its own copy).
enum { SHARED_MAX_BYTES = 64 << 20 };

// The jobs count tiles of M or N rows and columns: their bounds fit an int.
static void part_job(size_t begin_tile, size_t end_tile, void *ctx) {
    const agi_product_split *s = ctx;
    const int begin = (int)begin_tile, end = (int)end_tile;
    if (s->by_rows)
        s->part(s, begin * s->mr, agi_tile_end(end, s->mr, s->M), 0, s->N);
    else
        s->part(s, 0, s->M, begin * s->nr, agi_tile_end(end, s->nr, s->N));
}

static void pack_a_job(size_t begin, size_t end, void *ctx) {
    const agi_product_split *s = ctx;
    s->pack_a_panels(s, (int)begin, (int)end);
}

static void pack_b_job(size_t begin, size_t end, void *ctx) {
    const agi_product_split *s = ctx;
    s->pack_b_panels(s, (int)begin, (int)end);
}

void agi_product_run(agi_product_split *s, double work) {
    s->by_rows = false;
    s->a_packed = s->b_packed = NULL;
    const int threads = agi_parallel_threads(work);
    if (threads == 1) {
        s->part(s, 0, s->M, 0, s->N);
        return;
    }
    // M, N >= 1 here (the kernels return before on an empty product).
    const int row_tiles = agi_tiles(s->M, s->mr), col_tiles = agi_tiles(s->N, s->nr);
    const int slices = threads * AGI_SLICES_PER_THREAD;
    s->by_rows = col_tiles < slices || (s->pack_a && s->M > s->N);
    const double rows = (double)row_tiles * s->mr, cols = (double)col_tiles * s->nr;
    if (!s->by_rows && (s->pack_a || s->share_a) && s->K > 0 &&
        s->a_bytes <= SHARED_MAX_BYTES) {
        s->a_packed = agi_scratch_shared(s->a_bytes);
        agi_parallel_for((size_t)row_tiles, rows * s->K, pack_a_job, s);
    } else if (s->by_rows && s->pack_b && s->M / slices < s->own_b_min_rows && s->K > 0 &&
               s->b_bytes <= SHARED_MAX_BYTES) {
        s->b_packed = agi_scratch_shared(s->b_bytes);
        agi_parallel_for((size_t)col_tiles, cols * s->K, pack_b_job, s);
    }
    agi_parallel_for((size_t)(s->by_rows ? row_tiles : col_tiles), work, part_job, s);
}
