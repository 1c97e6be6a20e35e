// libFuzzer target for attograd-mha's input handling: the program's own
// main (tools/attograd-mha.c, compiled in as attograd_mha_main) runs on any
// IN and must exit 0 having written OUT, or 2 with one line and no OUT;
// never crash, leak or hit undefined behaviour. --max-memory keeps each run
// small (a valid IN may ask for any amount of work). Seeded with the
// committed tests/reference/mha/*.in.safetensors. See tests/fuzz/README.md.
#include "fuzz_common.h"

#define TARGET "fuzz_mha_tool"

int attograd_mha_main(int argc, char **argv);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *in = fuzz_write("mha.in.safetensors", data, size);
    const char *out = fuzz_path("mha.out.safetensors");
    unlink(out);
    char *argv[] = {"attograd-mha", "--max-memory", "256M", (char *)in, (char *)out, NULL};
    int rc = attograd_mha_main(5, argv);
    fuzz_require(rc == 0 || rc == 2, TARGET, "exit status other than 0 and 2");
    fuzz_require((rc == 0) == (access(out, F_OK) == 0), TARGET,
                 rc ? "OUT written by a failed run" : "no OUT after a successful run");
    return 0;
}
