#include "checkpoint.h"

#include <stdio.h>
#include <string.h>

#include "../common/checkpoint.h"
#include "../common/flags.h"

// "h0,h1,..": one count per layer, each in [1, heads].
static bool parse_heads(const char *s, int layers, int heads, int *out) {
    for (int l = 0; l < layers; l++) {
        char num[16];
        size_t len = strcspn(s, ",");
        if (len == 0 || len >= sizeof num) return false;
        memcpy(num, s, len);
        num[len] = '\0';
        if (!int_in_range(num, 1, heads, &out[l])) return false;
        s += len;
        if (l + 1 < layers && *s++ != ',') return false;
    }
    return *s == '\0';
}

void run_save(const options *o, const model *m, ag_optim *opt, const run_state *rs) {
    char step[16], last[16], tuned[16], heads[MAX_LAYERS * 12] = "";
    snprintf(step, sizeof step, "%d", rs->step);
    snprintf(last, sizeof last, "%d", rs->last_check);
    const char *extra[9] = {"copy_task.step", step, "copy_task.last_check", last, NULL};
    if (rs->pruned) {  // the shape to rebuild, and which Adam the state is
        for (int l = 0, at = 0; l < m->cfg.layers; l++)
            at += snprintf(heads + at, sizeof heads - (size_t)at, l ? ",%d" : "%d",
                           m->attn[l].cfg.num_heads);
        snprintf(tuned, sizeof tuned, "%d", rs->finetuned);
        extra[4] = "copy_task.heads";
        extra[5] = heads;
        extra[6] = "copy_task.finetune_steps";
        extra[7] = tuned;
    }
    checkpoint_save_everywhere(m->ps, opt, o->save, options_meta(o, extra), EXIT_FAILED);
}

// What a pruned model read from path must fit: --prune (the same K, or none), no flag
// about training steps, and --analyze-heads (as many heads in every layer). False with
// one line in err.
static bool pruned_fits(const options *o, const run_state *rs, const char *path, ag_err *err) {
    bool uniform = true;
    for (int l = 1; l < o->layers; l++) uniform = uniform && rs->heads[l] == rs->heads[0];
    if (o->prune && o->prune != rs->pruned)
        snprintf(err->msg, sizeof err->msg, "%s: holds a model pruned by %d head%s after "
                 "training; resume it with --prune %d or without --prune", path, rs->pruned,
                 rs->pruned == 1 ? "" : "s", rs->pruned);
    else if (o->profile || o->save_every)  // both about training steps: they were dropped
        snprintf(err->msg, sizeof err->msg, "%s: holds a model pruned after training, whose "
                 "run is over: it trains no step to %s", path,
                 o->profile ? "time (--profile)" : "save (--save-every)");
    else if (o->analyze_heads && !uniform)
        snprintf(err->msg, sizeof err->msg, "%s: --analyze-heads needs as many heads in every "
                 "layer, and this pruned model has %d in layer 0", path, rs->heads[0]);
    else
        return true;
    return false;
}

// --profile times a training step on the batch of the last one taken: a run resumed at
// --steps takes none, and it ran on a batch never drawn (an embedding index out of
// range, an abort). False with one line in err.
static bool profile_fits(const options *o, const run_state *rs, const char *path,
                         ag_err *err) {
    if (!o->profile || rs->step < o->steps) return true;
    snprintf(err->msg, sizeof err->msg, "%s: saved at step %d, so up to --steps %d no "
             "training step is left for --profile to time", path, rs->step, o->steps);
    return false;
}

// Reads rs from the metadata of `file` (from `path`).
static bool read_state(const options *o, const ag_safetensors *file, const char *path,
                       run_state *rs, ag_err *err) {
    const char *step = ag_safetensors_meta(file, "copy_task.step");
    const char *last = ag_safetensors_meta(file, "copy_task.last_check");
    const char *left = ag_safetensors_meta(file, "copy_task.heads");
    const char *tuned = ag_safetensors_meta(file, "copy_task.finetune_steps");
    const int layers = o->layers, heads = o->heads;
    if (!step || !last) {
        snprintf(err->msg, sizeof err->msg, "%s: not a copy_task checkpoint (no copy_task.step "
                 "and copy_task.last_check metadata)", path);
        return false;
    }
    if (!int_in_range(step, 0, STEPS_MAX, &rs->step) ||
        !int_in_range(last, -COOLDOWN, rs->step, &rs->last_check)) {
        snprintf(err->msg, sizeof err->msg, "%s: copy_task.step '%.40s' and copy_task.last_check "
                 "'%.40s' must be integers, 0 <= step <= %d and %d <= last_check <= step",
                 path, step, last, STEPS_MAX, -COOLDOWN);
        return false;
    }
    if (!left && !tuned) return profile_fits(o, rs, path, err);  // not pruned
    if (!left || !tuned || !parse_heads(left, layers, heads, rs->heads) ||
        !int_in_range(tuned, 0, STEPS_MAX, &rs->finetuned)) {
        snprintf(err->msg, sizeof err->msg, "%s: a pruned model's copy_task.heads '%.40s' and "
                 "copy_task.finetune_steps '%.40s' must be %d integer%s in [1, %d] separated by "
                 "commas, and an integer in [0, %d]", path, left ? left : "(none)",
                 tuned ? tuned : "(none)", layers, layers > 1 ? "s" : "", heads, STEPS_MAX);
        return false;
    }
    for (int l = 0; l < layers; l++) rs->pruned += heads - rs->heads[l];
    if (rs->pruned == 0) {
        snprintf(err->msg, sizeof err->msg, "%s: copy_task.heads '%s' prunes no head", path, left);
        return false;
    }
    return pruned_fits(o, rs, path, err);
}

// The table has a row for every position of the longest sequences its run was started
// for, --test-length's included, which no checkpoint records: resumed with another, the
// load refused only a size ("size mismatch for 'pos_emb.weight'"), naming no flag.
static bool table_fits(const ag_safetensors *file, const char *path, int pos_rows,
                       ag_err *err) {
    const ag_tensor *t = ag_safetensors_find(file, "pos_emb.weight");
    if (!pos_rows || !t || t->ndim != 2 || t->shape[0] == pos_rows) return true;
    snprintf(err->msg, sizeof err->msg, "%.300s: its position table pos_emb.weight has %d rows "
             "and this run needs %d: resume with the --test-length it was saved with", path,
             t->shape[0], pos_rows);
    return false;
}

bool run_read(const options *o, run_state *rs, int pos_rows, ag_err *err) {
    memset(rs, 0, sizeof *rs);
    ag_safetensors *file = ag_safetensors_load(o->resume, err);
    if (!file) return false;
    bool ok = options_match_file(o, file, o->resume, err) &&
              table_fits(file, o->resume, pos_rows, err) &&
              read_state(o, file, o->resume, rs, err);
    ag_safetensors_free(file);
    return ok;
}

bool run_load(const char *path, model *m, ag_optim *opt, const run_state *rs, ag_err *err) {
    if (!checkpoint_load_checked(m->ps, opt, path, STEPS_MAX, NULL, err)) return false;
    // Each training step is one Adam step (a step with a non-finite loss stops the run
    // unsaved); after pruning, each fine-tuning step is one step of a new Adam.
    long long taken = (long long)ag_optim_step_count(opt);
    int want = rs->pruned ? rs->finetuned : rs->step;
    if (taken == want) return true;
    snprintf(err->msg, sizeof err->msg, "%s: %s is %d, but the optimizer has taken %lld steps: "
             "they must be equal", path, rs->pruned ? "copy_task.finetune_steps" : "copy_task.step",
             want, taken);
    return false;
}
