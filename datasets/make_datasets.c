// Regenerates the committed datasets: make_datasets <dir> writes
// <dir>/{copy,reverse,recall}/{train,valid,test}.txt, byte for byte the files
// under datasets/ (see datasets/README.md).
#include <stdio.h>

#include "attograd.h"
#include "seqdata.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <dir>   (e.g. %s datasets)\n", argv[0], argv[0]);
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
