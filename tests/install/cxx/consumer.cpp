// consumer.c in C++11: the public headers compile as C++ (extern "C", no C-only syntax)
// and the installed library links from a C++ program.
#include <attograd.h>
#include <cstdio>

int main() {
    if (!ag_abi_check(AG_VERSION_MAJOR, AG_VERSION_MINOR)) return 1;
    ag_tape *tp = ag_tape_new();
    const int shape[1] = {4};
    ag_tensor *x = ag_tensor_ones(AG_F32, 1, shape);
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 3.0)));
    bool ok = ag_tensor_grad_item(x, 2) == 3.0;
    std::printf("attograd %s from C++: dy/dx = %g (%s)\n", ag_version(), ag_tensor_grad_item(x, 2),
                ok ? "ok" : "WRONG");
    ag_tensor_free(x);
    ag_tape_free(tp);
    return ok ? 0 : 1;
}
