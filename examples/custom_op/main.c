// A custom op, written and verified: softplus (softplus.c) goes through every check of
// ag_op_check; then a copy whose backward is 1% too large, which must fail, and whose
// report says which check and which elements. Exits 0 when the op passes and its wrong
// copy fails.
//
//     ./build/examples/custom_op
#include <stdio.h>
#include <string.h>

#include "../common/escape.h"
#include "softplus.h"

int main(int argc, char **argv) {
    // It takes no arguments: one given by mistake is refused rather than ignored.
    if (argc > 1) {
        bool help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        char shown[512];  // escaped: a newline in it split the line in two
        if (help) printf("usage: custom_op   (checks softplus and its wrong copy; no options)\n");
        else fprintf(stderr, "custom_op: unexpected argument '%s' (it takes none; see --help)\n",
                     escaped(argv[1], 100, shown, sizeof shown));
        return help ? 0 : 2;
    }
    // Both ops handle f32 and f64: each is its own f64 twin, so the f32 tape check runs
    // in f64 (see attograd/tape_check.h).
    ag_op_check_opts o = ag_op_check_defaults();
    o.f64_twins = softplus_twins;
    o.n_f64_twins = 2;

    printf("ag_op_check on softplus:\n");
    ag_op_check_result right;
    ag_op_check(&softplus_spec, &o, &right);

    printf("\nThe same op with its gradient 1%% too large:\n");
    ag_op_check_result wrong;
    ag_op_check(&softplus_wrong_spec, &o, &wrong);
    printf("\nits first failure: %s\n", wrong.first_failure);

    bool ok = right.failed == 0 && wrong.failed > 0;
    printf("\n%s\n", ok ? "softplus passes and its wrong copy fails, as they should"
                        : "UNEXPECTED: softplus should pass and its wrong copy fail");
    return ok ? 0 : 1;
}
