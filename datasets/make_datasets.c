// Regenerates the committed datasets: make_datasets <dir> writes
// <dir>/{copy,reverse,recall}/{train,valid,test}.txt, byte for byte the files
// under datasets/ (see datasets/README.md).
#include <stdio.h>
#include <string.h>

#include "attograd.h"
#include "seqdata.h"

static const char usage[] = "usage: make_datasets DIR   (e.g. make_datasets datasets)\n";

int main(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage, stdout);
        return 0;
    }
    // An option is never taken for the directory: "--help" made a directory of that name.
    if (argc == 2 && argv[1][0] == '-') {
        fprintf(stderr, "make_datasets: unknown option '%s' (see --help)\n", argv[1]);
        return 2;
    }
    if (argc != 2) {
        fprintf(stderr, "make_datasets: expected one argument, DIR; got %d (see --help)\n",
                argc - 1);
        return 2;
    }
    if (!argv[1][0]) {
        fprintf(stderr, "make_datasets: DIR needs a value, got an empty one\n");
        return 2;
    }
    ag_err err;
    if (ag_seqdata_make_standard(argv[1], &err) != 0) {
        fprintf(stderr, "make_datasets: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s/{copy,reverse,recall}/{train,valid,test}.txt\n", argv[1]);
    return 0;
}
