// ag_dist_sum's arguments are checked before anything is sent: a NULL array of n > 0
// values is one line, and nothing is read. (Runs without mpirun.)
#include "attograd/dist.h"
#include "testing.h"

static void null_values_are_refused(void) {
    testing_catch_errors();
    ag_dist_sum(NULL, 3);
    CHECK(testing_error_count == 1);
    CHECK(strcmp(testing_last_error, "dist_sum: values is NULL (n 3)") == 0);
    testing_release_errors();
}

static void no_values_is_nothing_to_do(void) {
    testing_catch_errors();
    ag_dist_sum(NULL, 0);
    CHECK(testing_error_count == 0);
    testing_release_errors();
}

int main(void) {
    RUN(null_values_are_refused);
    RUN(no_values_is_nothing_to_do);
    return testing_summary();
}
