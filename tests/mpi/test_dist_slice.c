// ag_dist_batch_slice: the ranks' slices tile the global batch evenly.
// (Plain arithmetic: runs without mpirun.)
#include "attograd/dist.h"
#include "testing.h"

static void slices_tile_the_batch_in_rank_order(void) {
    for (int size = 1; size <= 5; size++)
        for (int B = size; B <= 23; B++) {
            int next = 0, lo = B, hi = 0;
            double weights = 0;
            for (int r = 0; r < size; r++) {
                ag_dist_slice s = ag_dist_batch_slice(B, r, size);
                CHECK(s.first == next);
                CHECK(s.count >= 1);
                CHECK(s.weight == (double)s.count / B);
                next += s.count, weights += s.weight;
                lo = s.count < lo ? s.count : lo;
                hi = s.count > hi ? s.count : hi;
            }
            CHECK(next == B);
            CHECK(hi - lo <= 1);
            CHECK_NEAR(weights, 1.0, 1e-15);
        }
}

static void uneven_batch_gives_the_first_ranks_one_more(void) {
    ag_dist_slice a = ag_dist_batch_slice(16, 0, 3), b = ag_dist_batch_slice(16, 1, 3),
                  c = ag_dist_batch_slice(16, 2, 3);
    CHECK(a.first == 0 && a.count == 6);
    CHECK(b.first == 6 && b.count == 5);
    CHECK(c.first == 11 && c.count == 5);
    CHECK(a.weight == 6.0 / 16 && c.weight == 5.0 / 16);
}

static void batch_smaller_than_the_job_is_an_error(void) {
    testing_catch_errors();
    ag_dist_slice s = ag_dist_batch_slice(2, 0, 3);
    CHECK(testing_error_count == 1);
    CHECK(s.count == 0 && s.weight == 0);
    CHECK(strstr(testing_last_error, "dist_batch_slice: a global batch of 2 leaves some of the 3 "
                                     "processes without data") != NULL);
    testing_release_errors();
}

static void rank_outside_the_job_is_an_error(void) {
    testing_catch_errors();
    ag_dist_slice s = ag_dist_batch_slice(8, 2, 2);
    CHECK(testing_error_count == 1);
    CHECK(s.count == 0);
    CHECK(strstr(testing_last_error, "rank 2 is not one of 2 processes") != NULL);
    testing_release_errors();
}

int main(void) {
    RUN(slices_tile_the_batch_in_rank_order);
    RUN(uneven_batch_gives_the_first_ranks_one_more);
    RUN(batch_smaller_than_the_job_is_an_error);
    RUN(rank_outside_the_job_is_an_error);
    return testing_summary();
}
