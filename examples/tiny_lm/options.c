#include "options.h"

#include <string.h>

#include "../common/flags.h"

#define DEFAULT_DATA "/usr/share/common-licenses"

// saved: recorded in checkpoints and read back by --resume / --generate.
typedef struct {
    flag f;
    bool saved;
} option;

static int table(options *o, option *t) {
    lm_config *m = &o->model;
    option all[] = {
        {{"--data", FLAG_STRING, &o->data, 0, 0, "text file, or directory of them (default " DEFAULT_DATA ")", 0}, 0},
        {{"--ctx", FLAG_INT, &m->ctx, 1, 4096, "context length (bytes)", 0}, 1},
        {{"--d-model", FLAG_INT, &m->d_model, 1, 4096, "model width", 0}, 1},
        {{"--heads", FLAG_INT, &m->heads, 1, 256, "attention heads", 0}, 1},
        {{"--layers", FLAG_INT, &m->layers, 1, LM_MAX_LAYERS, "transformer blocks", 0}, 1},
        {{"--ff", FLAG_INT, &m->ff, 0, 65536, "feed-forward width, 0 = 4 * d-model", 0}, 1},
        {{"--dropout", FLAG_REAL, &m->dropout, 0, 0.99, "dropout everywhere", 0}, 1},
        {{"--untied", FLAG_SWITCH, &m->untied, 0, 0, "own output head (default: tied to wte)", 0}, 1},
        {{"--f64", FLAG_SWITCH, &m->f64, 0, 0, "train in float64", 0}, 1},
        {{"--steps", FLAG_INT, &o->steps, 0, 1e9, "training steps in all", 0}, 1},
        {{"--batch", FLAG_INT, &o->batch, 1, 65536, "sequences per step", 0}, 1},
        {{"--lr", FLAG_REAL, &o->lr, 0, 10, "peak learning rate (AdamW)", 0}, 1},
        {{"--min-lr", FLAG_REAL, &o->min_lr, 0, 10, "learning rate at the end of the cosine", 0}, 1},
        {{"--warmup", FLAG_INT, &o->warmup, 0, 1e9, "linear warmup steps", 0}, 1},
        {{"--weight-decay", FLAG_REAL, &o->weight_decay, 0, 10, "AdamW decay of the matrices", 0}, 1},
        {{"--beta2", FLAG_REAL, &o->beta2, 0, 0.999999, "AdamW beta2", 0}, 1},
        {{"--clip", FLAG_REAL, &o->clip, 0, 1e9, "gradient clipping (global norm), 0 = off", 0}, 1},
        {{"--valid", FLAG_REAL, &o->valid_fraction, 0.001, 0.5, "fraction of the text for validation", 0}, 1},
        {{"--eval-every", FLAG_INT, &o->eval_every, 1, 1e9, "steps between validations", 0}, 1},
        {{"--eval-batches", FLAG_INT, &o->eval_batches, 1, 1e6, "batches per validation", 0}, 1},
        {{"--seed", FLAG_U64, &o->seed, 0, 9007199254740992.0, "seeds weights, batches, dropout", 0}, 1},
        {{"--threads", FLAG_INT, &o->threads, 1, 256, "attograd threads", 0}, 0},
        {{"--out", FLAG_STRING, &o->out, 0, 0, "prefix of the CSV and SVG written (default tiny_lm)", 0}, 0},
        {{"--save", FLAG_STRING, &o->save, 0, 0, "checkpoint to write at the end", 0}, 0},
        {{"--resume", FLAG_STRING, &o->resume, 0, 0, "checkpoint to continue, up to --steps", 0}, 0},
        {{"--generate", FLAG_STRING, &o->generate, 0, 0, "only sample from this checkpoint", 0}, 0},
        {{"--prompt", FLAG_STRING, &o->prompt, 0, 0, "text the sample continues (default: a newline)", 0}, 0},
        {{"--sample", FLAG_INT, &o->sample_len, 0, 1e7, "bytes to sample at the end", 0}, 0},
        {{"--temperature", FLAG_REAL, &o->temperature, 0, 100, "sampling temperature, 0 = greedy", 0}, 0},
        {{"--top-k", FLAG_INT, &o->top_k, 0, 256, "sample among the k likeliest, 0 = all", 0}, 0},
        {{"--top-p", FLAG_REAL, &o->top_p, 1e-9, 1, "sample within this probability mass", 0}, 0},
    };
    int n = (int)(sizeof all / sizeof all[0]);
    if (t) memcpy(t, all, sizeof all);
    return n;
}

static option opts[64];

int options_parse(options *o, int argc, char **argv) {
    *o = (options){.model = {64, 64, 4, 4, 0, 0.1, false, false},
                   .data = DEFAULT_DATA, .out = "tiny_lm", .prompt = "\n",
                   .steps = 2000, .batch = 16, .warmup = 100, .eval_every = 100,
                   .eval_batches = 16, .threads = 1, .sample_len = 400, .top_k = 0,
                   .lr = 3e-3, .min_lr = 3e-4, .weight_decay = 0.1, .clip = 1.0, .beta2 = 0.99,
                   .valid_fraction = 0.1, .temperature = 0.8, .top_p = 0.95, .seed = 1};
    int n = table(o, opts);
    flag flags[64];
    for (int i = 0; i < n; i++) flags[i] = opts[i].f;
    int r = flags_parse("tiny_lm", "usage: tiny_lm [options]  (trains, then samples)", flags, n,
                        argc, argv);
    if (r) return r;
    const char *ckpt = o->generate ? o->generate : o->resume;
    if (!ckpt) return 0;
    // Every saved setting not given again comes from the checkpoint.
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(ckpt, &err);
    if (!st) {
        fprintf(stderr, "tiny_lm: %s\n", err.msg);
        return 2;
    }
    for (int i = 0; i < n && r == 0; i++) {
        if (!opts[i].saved || flags[i].given) continue;
        const char *v = ag_safetensors_meta(st, flags[i].name + 2);
        if (!v) {
            fprintf(stderr, "tiny_lm: %s: no '%s' in the metadata: not a tiny_lm checkpoint\n",
                    ckpt, flags[i].name + 2);
            r = 2;
        } else if (!flags_set("tiny_lm", &flags[i], v)) {
            r = 2;
        }
    }
    ag_safetensors_free(st);
    return r;
}

const char *const *options_meta(const options *o) {
    static char values[64][64];
    static const char *meta[129];
    options copy = *o;
    int n = table(&copy, opts), k = 0;
    for (int i = 0; i < n; i++) {
        if (!opts[i].saved) continue;
        flags_format(&opts[i].f, values[i], sizeof values[i]);
        meta[k++] = opts[i].f.name + 2;
        meta[k++] = values[i];
    }
    meta[k] = NULL;
    return meta;
}
