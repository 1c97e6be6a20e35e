// Linked with OpenBLAS's static archive after libattograd.a (test_install.sh): OpenBLAS's
// constructor then runs after attograd's, and attograd must still have stopped the workers
// it starts (src/core/parallel.c), which otherwise spin in every program and crashed an
// exit now and then. Once a tape exists, the process has one thread: main's.
#include <attograd.h>
#include <dirent.h>
#include <stdio.h>

int main(void) {
    ag_tape *tp = ag_tape_new();
    int threads = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return 2;
    for (struct dirent *e; (e = readdir(d));) threads += e->d_name[0] != '.';
    closedir(d);
    ag_tape_free(tp);
    printf("threads after ag_tape_new: %d\n", threads);
    return threads == 1 ? 0 : 1;
}
