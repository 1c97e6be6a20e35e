#define _XOPEN_SOURCE 700  // realpath
#include "options.h"

#include <stdlib.h>
#include <string.h>

#include "../common/checkpoint.h"
#include "../common/dist.h"
#include "../common/dist_agree.h"
#include "../common/flags.h"
#include "../common/path.h"

#define DEFAULT_DATA "/usr/share/common-licenses"
#define USAGE "usage: tiny_lm [options]  (trains, then samples)"
#define EXIT_REFUSED 2

// The flags, one row each (see ../common/flags.h): saved ones (1) are recorded in
// checkpoints; per-rank ones may differ between the processes of an MPI run.
static int table(options *o, flag *t) {
    lm_config *m = &o->model;
    flag all[] = {
        FLAG("--data", STRING, &o->data, 0, 0, 1,
             "text file, or directory of them", .per_rank = true),
        FLAG("--ctx", INT, &m->ctx, 1, 4096, 1, "context length (bytes)"),
        FLAG("--d-model", INT, &m->d_model, 1, 4096, 1, "model width"),
        FLAG("--heads", INT, &m->heads, 1, 256, 1, "attention heads (dividing --d-model)"),
        FLAG("--layers", INT, &m->layers, 1, LM_MAX_LAYERS, 1, "transformer blocks"),
        FLAG("--ff", INT, &m->ff, 0, 65536, 1, "feed-forward width, 0 = 4 * d-model"),
        FLAG("--pos", CHOICE, &m->pos, 0, 0, 1, "positions: a learned table, or in the attention",
             .choices = flags_pos_choices("learned")),
        FLAG("--dropout", REAL, &m->dropout, 0, 0.99, 1, "dropout everywhere"),
        FLAG("--untied", SWITCH, &m->untied, 0, 0, 1, "own output head (default: tied to wte)"),
        FLAG("--f64", SWITCH, &m->f64, 0, 0, 1, "train in float64"),
        FLAG("--bf16", SWITCH, &o->bf16, 0, 0, 1,
             "matrix products in bfloat16 (autocast), the rest in float32; sampling too "
             "(bf16 copies of the weights)"),
        FLAG("--steps", INT, &o->steps, 0, 1e9, 1, "training steps in all"),
        FLAG("--batch", INT, &o->batch, 1, 65536, 1, "sequences per step (all processes)"),
        FLAG("--lr", REAL, &o->lr, 0, 10, 1, "peak learning rate (AdamW)"),
        FLAG("--min-lr", REAL, &o->min_lr, 0, 10, 1, "learning rate at the end of the cosine"),
        FLAG("--warmup", INT, &o->warmup, 0, 1e9, 1, "linear warmup steps"),
        FLAG("--weight-decay", REAL, &o->weight_decay, 0, 10, 1, "AdamW decay of the matrices"),
        FLAG("--beta2", REAL, &o->beta2, 0, 0.999999, 1, "AdamW beta2"),
        FLAG("--clip", REAL, &o->clip, 0, 1e9, 1, "gradient clipping (global norm), 0 = off"),
        FLAG("--valid", REAL, &o->valid_fraction, 0.001, 0.5, 1, "fraction for validation"),
        FLAG("--eval-every", INT, &o->eval_every, 1, 1e9, 1, "steps between validations"),
        FLAG("--eval-batches", INT, &o->eval_batches, 1, 1e6, 1, "batches per validation"),
        FLAG("--seed", U64, &o->seed, 0, 9007199254740992.0, 1, "seeds everything random"),
        FLAG("--threads", INT, &o->threads, 1, 64, 0, "attograd threads", .per_rank = true),
        FLAG("--out", STRING, &o->out, 0, 0, 0, "prefix of the CSV and SVG",
             .per_rank = true),
        FLAG("--save", STRING, &o->save, 0, 0, 0, "checkpoint to write at the end",
             .per_rank = true),
        FLAG("--resume", STRING, &o->resume, 0, 0, 0, "checkpoint to continue, up to --steps",
             .per_rank = true),
        FLAG("--generate", STRING, &o->generate, 0, 0, 0, "only sample from this checkpoint",
             .per_rank = true),
        FLAG("--prompt", STRING, &o->prompt, 0, 0, 0, "text the sample continues"),
        FLAG("--sample", INT, &o->sample_len, 0, 1e7, 0, "bytes to sample at the end"),
        FLAG("--temperature", REAL, &o->sampling.temperature, 0, 100, 0, "0 = greedy"),
        FLAG("--top-k", INT, &o->sampling.top_k, 0, 256, 0, "the k likeliest only, 0 = all"),
        FLAG("--top-p", REAL, &o->sampling.top_p, 1e-9, 1, 0, "within this probability mass"),
    };
    if (t) memcpy(t, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

// The size of dimension `dim` of tensor `name` in the file; -1 if it has none.
static int dim_of(const ag_safetensors *file, const char *name, int dim) {
    const ag_tensor *t = ag_safetensors_find(file, name);
    return t && dim < t->ndim ? t->shape[dim] : -1;
}

// "<path>: the metadata says ff 65536, but blocks.0.linear1.weight is [64, 16]" (or
// "is absent"; "--ff 32 given here" when the command line gave it) in err; returns false.
static bool mismatch(const flag *flags, int n, const ag_safetensors *file, const char *path,
                     const char *name, const char *what, int said, ag_err *err) {
    const ag_tensor *t = ag_safetensors_find(file, name);
    char shape[96] = "absent";
    for (int i = 0, at = 0; t && i < t->ndim; i++)
        at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%d%s", i ? ", " : "[",
                       t->shape[i], i + 1 < t->ndim ? "" : "]");
    char flag_name[32], said_text[80];
    snprintf(flag_name, sizeof flag_name, "--%s", what);
    if (flags_given(flags, n, flag_name))
        snprintf(said_text, sizeof said_text, "%s %d given here", flag_name, said);
    else
        snprintf(said_text, sizeof said_text, "the metadata says %s %d", what, said);
    snprintf(err->msg, sizeof err->msg, "%.300s: %s, but %s is %s", path, said_text, name,
             shape);
    return false;
}

// A checkpoint's sizes are those of the tensors it holds (model.h names them), checked
// before the model is built: its metadata decides what the model allocates, and a
// file of 425 KB that claimed 64 layers of width 4096 asked for 155 GB. The heads
// allocate nothing of their own; the context, only a table of learned positions.
static bool sizes_match_tensors(const flag *flags, int n, const options *o,
                                const ag_safetensors *file, const char *path, ag_err *err) {
    const lm_config *m = &o->model;
    const int ff = m->ff ? m->ff : 4 * m->d_model;
    if (dim_of(file, "wte.weight", 1) != m->d_model)
        return mismatch(flags, n, file, path, "wte.weight", "d-model", m->d_model, err);
    if (m->pos == AG_POS_NONE && dim_of(file, "wpe.weight", 0) != m->ctx)
        return mismatch(flags, n, file, path, "wpe.weight", "ctx", m->ctx, err);
    for (int l = 0; l < m->layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "blocks.%d.linear1.weight", l);
        if (!ag_safetensors_find(file, name))
            return mismatch(flags, n, file, path, name, "layers", m->layers, err);
        if (dim_of(file, name, 0) != ff)
            return mismatch(flags, n, file, path, name, "ff", ff, err);
    }
    return true;
}

// The flags that shape the model, but not the tensors' sizes alone: a checkpoint of 2
// heads sampled with --heads 4 given loaded (the same tensors), and the run went on
// with a model the checkpoint never was. Given with --resume or --generate, they must
// be what the checkpoint records. (--ff is left to the sizes: 0 means 4 * d-model.)
static const char *const shape_flags[] = {"--ctx", "--d-model", "--heads", "--layers",
                                          "--pos", "--untied", NULL};

static bool shape_flags_agree(const flag *flags, int n, const ag_safetensors *file,
                              const char *path, ag_err *err) {
    for (int i = 0; i < n; i++) {
        bool shaping = false;
        for (int k = 0; shape_flags[k]; k++)
            shaping = shaping || !strcmp(flags[i].name, shape_flags[k]);
        const char *there = ag_safetensors_meta(file, flags[i].name + 2);
        if (!shaping || !flags[i].given || !there) continue;
        char here[64];
        flags_format(&flags[i], here, sizeof here);
        if (strcmp(here, there) != 0) {
            snprintf(err->msg, sizeof err->msg, "%.300s: saved by a run with other settings: "
                     "%s %.40s there, %s here", path, flags[i].name, there, here);
            return false;
        }
    }
    return true;
}

// The flags of a run that trains, which --generate (sampling only) would leave unused.
static const char *const training_only[] = {
    "--resume", "--save", "--data", "--out", "--steps", "--batch", "--lr", "--min-lr",
    "--warmup", "--weight-decay", "--beta2", "--clip", "--valid", "--eval-every",
    "--eval-batches", "--dropout", NULL};

// Reads the settings --resume's or --generate's checkpoint recorded, for the flags not
// given; false with one line in err if the file does not load, lacks one, records
// another model than the flags given, or holds tensors of other sizes.
static bool from_checkpoint(flag *flags, int n, options *o, const char *path, ag_err *err) {
    ag_safetensors *file = ag_safetensors_load(path, err);
    if (!file) return false;
    bool ok = shape_flags_agree(flags, n, file, path, err) &&
              flags_from_file(flags, n, file, path, err) &&
              sizes_match_tensors(flags, n, o, file, path, err);
    ag_safetensors_free(file);
    return ok;
}

// What the model cannot be built with, caught before it is built.
static bool buildable(const options *o, ag_err *err) {
    const lm_config *m = &o->model;
    if (m->d_model % m->heads)
        snprintf(err->msg, sizeof err->msg, "--d-model %d is not a multiple of --heads %d",
                 m->d_model, m->heads);
    else if (m->pos == AG_POS_ROPE && m->d_model / m->heads % 2)
        snprintf(err->msg, sizeof err->msg, "--pos rope needs an even head width, got "
                 "--d-model %d / --heads %d = %d", m->d_model, m->heads, m->d_model / m->heads);
    else if (o->min_lr > o->lr)  // the cosine would climb from --lr to it
        snprintf(err->msg, sizeof err->msg, "--min-lr %g is above --lr %g: the learning rate "
                 "decays from --lr to --min-lr", o->min_lr, o->lr);
    else if (m->f64 && o->bf16)  // it would train and sample in float64, --bf16 dropped
        snprintf(err->msg, sizeof err->msg, "--bf16 rounds the float32 products to bfloat16, "
                 "but --f64 trains in float64, which autocast leaves alone: give one of them");
    else if (o->batch < dist_size())
        snprintf(err->msg, sizeof err->msg, "--batch %d is less than the %d processes: each "
                 "needs at least one window", o->batch, dist_size());
    else
        return true;
    return false;
}

void options_parse(options *o, int argc, char **argv) {
    *o = (options){
        .model = {.ctx = 64, .d_model = 64, .heads = 4, .layers = 4, .ff = 0,
                  .pos = AG_POS_NONE, .dropout = 0.1},
        .data = DEFAULT_DATA, .out = "tiny_lm", .prompt = "\n",
        .steps = 2000, .batch = 32, .warmup = 100, .eval_every = 100, .eval_batches = 16,
        .threads = 1, .sample_len = 400, .lr = 3e-3, .min_lr = 3e-4, .weight_decay = 0.1,
        .clip = 1.0, .beta2 = 0.99, .valid_fraction = 0.1,
        .sampling = {.temperature = 0.8, .top_k = 0, .top_p = 0.95}, .seed = 1};
    flag flags[FLAGS_MAX];
    const int n = table(o, flags);
    dist_flags_parse(USAGE, flags, n, argc, argv);
    o->data_given = flags_given(flags, n, "--data");
    const char *checkpoint = o->generate ? o->generate : o->resume;
    ag_err err;
    // --generate only samples: a flag of training beside it was dropped without a word
    // (tiny_lm --generate a.ck --save b.ck wrote nothing, --steps 4000 trained no step, and
    // both exited 0).
    const char *unused = o->generate ? flags_first_given(flags, n, training_only) : NULL;
    dist_check(unused != NULL, EXIT_REFUSED, "--generate only samples from its checkpoint: it "
               "takes no %s", unused ? unused : "");
    bool read = !checkpoint || from_checkpoint(flags, n, o, checkpoint, &err);
    dist_check(!read, EXIT_REFUSED, "%s", err.msg);
    if (o->data_given) {  // recorded as a full path, so a resume finds it anywhere
        static char full[FLAGS_VALUE_MAX];
        char *p = realpath(o->data, NULL);
        if (p && strlen(p) < sizeof full) o->data = strcpy(full, p);
        free(p);
    }
    dist_check(!buildable(o, &err), EXIT_REFUSED, "%s", err.msg);
    if (!o->generate) {  // a run that trains: what it writes must not be what it reads
        char csv[FLAGS_VALUE_MAX + 8], svg[FLAGS_VALUE_MAX + 8];
        path_beside(csv, sizeof csv, o->out, "", ".csv");
        path_beside(svg, sizeof svg, o->out, "", ".svg");
        const run_file files[] = {{"--data", o->data, false, NULL},
                                  {"--resume", o->resume, false, NULL},
                                  {"--save", o->save, true, "--resume"},
                                  {"--out", csv, true, NULL},
                                  {"--out", svg, true, NULL}};
        dist_check(!run_files_distinct(files, 5, &err) ||
                       !run_files_outside(files, 5, "--data", o->data, &err),
                   EXIT_REFUSED, "%s", err.msg);
    }
    dist_agree_flags(flags, n);
    // Rank 0 writes the checkpoint: a --save it cannot write (a directory, a missing
    // one) was found only after training, and the training was lost. So was --out's plot,
    // with a line that named no program, and the run exited 0.
    // The CSV too: a FIFO by its name stopped the run for good where it opened the CSV.
    char csv[FLAGS_VALUE_MAX + 8], svg[FLAGS_VALUE_MAX + 8];
    path_beside(csv, sizeof csv, o->out, "", ".csv");
    path_beside(svg, sizeof svg, o->out, "", ".svg");
    bool writable = dist_rank() != 0 || o->generate ||
                    ((!o->save || checkpoint_path_usable("--save", o->save, &err)) &&
                     checkpoint_path_usable("--out", csv, &err) &&
                     checkpoint_path_usable("--out", svg, &err));
    dist_check(!writable, EXIT_REFUSED, "%s", err.msg);
}

const char *const *options_meta(const options *o, const char *data_text) {
    static flags_meta meta;
    options copy = *o;
    flag flags[FLAGS_MAX];
    const int n = table(&copy, flags);
    return flags_to_meta(&meta, flags, n, (const char *const[]){"data-text", data_text, NULL});
}
