// The dist calls' arguments are checked before anything is sent: a NULL array of n > 0
// values is one line, and nothing is read; so is a NULL store, named by the call that got
// it. (Runs without mpirun.)
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

// The broadcast returned without a word before ag_dist_init, and the all-reduce reported
// three lines naming params_dtype, params_buffer_len and params_grad.
static void null_store_is_one_line_naming_the_call(void) {
    testing_catch_errors();
    ag_dist_broadcast_params(NULL);
    CHECK(testing_error_count == 1);
    CHECK(strcmp(testing_last_error, "dist_broadcast_params: the store is NULL") == 0);
    ag_dist_allreduce_grads(NULL, 0.5);
    CHECK(testing_error_count == 2);
    CHECK(strcmp(testing_last_error, "dist_allreduce_grads: the store is NULL") == 0);
    testing_release_errors();
}

int main(void) {
    RUN(null_values_are_refused);
    RUN(no_values_is_nothing_to_do);
    RUN(null_store_is_one_line_naming_the_call);
    return testing_summary();
}
