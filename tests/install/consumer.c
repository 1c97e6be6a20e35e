// A program outside the project, built against the INSTALLED attograd (with
// pkg-config and with find_package): it checks that the library has the ABI of the
// headers it was built with, differentiates y = sum(3 x) and checks that dy/dx = 3.
#include <attograd.h>
#include <stdio.h>

int main(void) {
    if (!ag_abi_check(AG_VERSION_MAJOR, AG_VERSION_MINOR)) return 1;
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_ones(AG_F32, 1, (int[]){4});
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 3.0)));
    int ok = ag_tensor_grad_item(x, 2) == 3.0;
    printf("attograd %s: dy/dx = %g (%s)\n", ag_version(), ag_tensor_grad_item(x, 2),
           ok ? "ok" : "WRONG");
    ag_tensor_free(x);
    ag_tape_free(tp);
    return ok ? 0 : 1;
}
