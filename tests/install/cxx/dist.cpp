// Links attograd_dist from a C++ program (built, not run: tests/mpi runs the library).
#include <attograd.h>
#include <attograd/dist.h>

int main(int argc, char **argv) {
    ag_dist_init(&argc, &argv);
    int rank = ag_dist_rank();
    ag_dist_finalize();
    return rank < 0;
}
