// libFuzzer target for the training-checkpoint loader: any file must either
// restore a store and its optimizer (which then takes a step) or fail with
// one line naming it; never crash, leak or hit undefined behaviour (an
// overflowing step count included). The store and the optimizer are made to
// the file's measure, so mutations reach the optimizer's checks: parameters
// are its F32/F64 tensors outside "optimizer.", the optimizer's kind is its
// "optimizer" metadata. Seeded with checkpoints (.ci/run writes one with
// copy_task) and the committed reference files. See tests/fuzz/README.md.
#include "fuzz_common.h"

#include "attograd/io.h"
#include "attograd/optim.h"

#include <math.h>

#define TARGET "fuzz_checkpoint"

// Checkpoints take the optimizer itself here, and its ag_state
// (attograd/state.h) once branch floors's io without optimizers is merged:
// the target compiles against either.
#ifdef ATTOGRAD_STATE_H
#define OPTIMIZER_STATE(opt) ag_optim_state(opt)
#else
#define OPTIMIZER_STATE(opt) (opt)
#endif
#define MAX_STORE_NUMEL (1 << 20)

static int library_errors;
static void count_error(const char *msg, void *user) {
    (void)msg, (void)user;
    library_errors++;
}

static ag_params *store_like(const ag_safetensors *st) {
    ag_params *ps = NULL;
    size_t numel = 0;
    library_errors = 0;
    for (int i = 0; i < ag_safetensors_count(st) && !library_errors; i++) {
        const char *name = ag_safetensors_name(st, i);
        const ag_tensor *t = ag_safetensors_at(st, i);
        if (!strncmp(name, "optimizer.", 10)) continue;
        if ((t->dtype != AG_F32 && t->dtype != AG_F64) || (numel += t->numel) > MAX_STORE_NUMEL)
            break;
        if (!ps) ps = ag_params_new(t->dtype);
        if (!ag_params_add(ps, name, t->ndim, t->shape)) library_errors++;
    }
    if (ps && !library_errors && ag_params_count(ps) > 0) return ps;
    ag_params_free(ps);
    return NULL;
}

// The file's kind (Adam when it names none), with the settings that decide which
// buffers exist taken from the file, so that mutations reach the buffers' checks.
static ag_optim *optimizer_for(const ag_safetensors *st, ag_params *ps) {
    const char *kind = ag_safetensors_meta(st, "optimizer");
    const char *momentum = ag_safetensors_meta(st, "optimizer.momentum");
    const char *centered = ag_safetensors_meta(st, "optimizer.centered");
    ag_optim_config cfg = ag_optim_defaults(AG_ADAM);
    for (int k = 0; kind && k < AG_OPTIM_KIND_COUNT; k++)
        if (!strcmp(kind, ag_optim_kind_name((ag_optim_kind)k)))
            cfg = ag_optim_defaults((ag_optim_kind)k);
    if (isnan(cfg.lr)) cfg.lr = 0.1;  // SGD has no default
    cfg.momentum = momentum && strtod(momentum, NULL) != 0 ? 0.9 : 0;
    cfg.centered = centered && !strcmp(centered, "true");
    return ag_optim_new(ps, &cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ag_err parse_err;
    ag_safetensors *shape = ag_safetensors_load_buffer(data, size, "fuzz", &parse_err);
    if (!shape) return 0;  // fuzz_safetensors covers files that do not parse
    const char *path = fuzz_write("checkpoint.safetensors", data, size);
    ag_error_handler_set(count_error, NULL);
    ag_params *ps = store_like(shape);
    ag_optim *opt = ps && !library_errors ? optimizer_for(shape, ps) : NULL;
    ag_error_handler_set(NULL, NULL);
    if (opt) {
        ag_err err = {{0}};
        ag_safetensors *file = NULL;
        if (ag_checkpoint_load(ps, OPTIMIZER_STATE(opt), path, &file, &err) == 0) {
            fuzz_require(file != NULL, TARGET, "no file returned");
            ag_params_zero_grad(ps);
            ag_optim_step(opt);  // the restored step count and state must be usable
            ag_safetensors_free(file);
        } else {
            fuzz_require(file == NULL, TARGET, "a file returned on failure");
            fuzz_check_message(TARGET, &err, path);
        }
        // The model's part alone (evaluation).
        if (ag_checkpoint_load(ps, NULL, path, NULL, &err) != 0)
            fuzz_check_message(TARGET, &err, path);
    }
    ag_optim_free(opt);
    ag_params_free(ps);
    ag_safetensors_free(shape);
    return 0;
}
