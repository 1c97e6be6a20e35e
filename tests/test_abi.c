// The version and the ABI check (base.h): the version the library reports is the one its
// headers carry, and ag_abi_check accepts the headers a program was built with and
// refuses any other 0.x minor (the ABI changes with every minor while the major is 0).
// tests/install/test_install.sh checks the rest of the policy on an installed library:
// the SONAME, an old binary that fails to load, headers of another version refused.
#include "testing.h"

static void test_version_string_is_the_headers_version(void) {
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", AG_VERSION_MAJOR, AG_VERSION_MINOR,
             AG_VERSION_PATCH);
    CHECK(strcmp(ag_version(), expected) == 0);
    CHECK(strcmp(ag_version(), "0.4.2") == 0);  // 0.4.2: ag_pos_kind_name is new
}

static void test_abi_check_accepts_the_headers_it_was_built_with(void) {
    testing_catch_errors();
    CHECK(ag_abi_check(AG_VERSION_MAJOR, AG_VERSION_MINOR));
    CHECK(testing_error_count == 0);
    testing_release_errors();
}

static void test_abi_check_refuses_another_minor_while_major_is_0(void) {
    testing_catch_errors();
    CHECK(!ag_abi_check(0, 3));
    CHECK(testing_error_was("abi_check: built against the headers of attograd 0.3, but this "
                            "library is 0.4.2, whose ABI differs: rebuild against its headers"));
    CHECK(!ag_abi_check(0, 5));
    CHECK(testing_error_was("abi_check: built against the headers of attograd 0.5, but this "
                            "library is 0.4.2, whose ABI differs: rebuild against its headers"));
    CHECK(!ag_abi_check(1, 2));
    CHECK(testing_error_was("abi_check: built against the headers of attograd 1.2, but this "
                            "library is 0.4.2, whose ABI differs: rebuild against its headers"));
    testing_release_errors();
}

int main(void) {
    RUN(test_version_string_is_the_headers_version);
    RUN(test_abi_check_accepts_the_headers_it_was_built_with);
    RUN(test_abi_check_refuses_another_minor_while_major_is_0);
    return testing_summary();
}
