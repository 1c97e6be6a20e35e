#include "checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool int_in_range(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!(*s == '-' || (*s >= '0' && *s <= '9')) || errno || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

// "h0,h1,..": one count per layer, each in [1, heads].
static bool parse_heads(const char *s, int layers, int heads, int *out) {
    for (int l = 0; l < layers; l++) {
        char num[16];
        size_t len = strcspn(s, ",");
        if (len == 0 || len >= sizeof num) return false;
        memcpy(num, s, len), num[len] = '\0';
        if (!int_in_range(num, 1, heads, &out[l])) return false;
        s += len;
        if (l + 1 < layers && *s++ != ',') return false;
    }
    return *s == '\0';
}

bool run_save(const char *path, const model *m, ag_optim *opt, const char *run,
              const run_state *rs, ag_err *err) {
    char step[16], last[16], tuned[16], heads[MAX_LAYERS * 12] = "";
    snprintf(step, sizeof step, "%d", rs->step);
    snprintf(last, sizeof last, "%d", rs->last_check);
    const char *meta[11] = {"copy_task.run", run, "copy_task.step", step,
                            "copy_task.last_check", last, NULL};
    if (rs->pruned) {  // the shape to rebuild, and which Adam the state is
        for (int l = 0, at = 0; l < m->cfg.layers; l++)
            at += snprintf(heads + at, sizeof heads - (size_t)at, l ? ",%d" : "%d",
                           m->attn[l].cfg.num_heads);
        snprintf(tuned, sizeof tuned, "%d", rs->finetuned);
        meta[6] = "copy_task.heads", meta[7] = heads;
        meta[8] = "copy_task.finetune_steps", meta[9] = tuned;
    }
    return ag_checkpoint_save(m->ps, ag_optim_state(opt), path, meta, err) == 0;
}

bool run_read(const char *path, const char *run, int layers, int heads, run_state *rs,
              ag_err *err) {
    memset(rs, 0, sizeof *rs);
    ag_safetensors *file = ag_safetensors_load(path, err);
    if (!file) return false;
    const char *saved = ag_safetensors_meta(file, "copy_task.run");
    const char *step = ag_safetensors_meta(file, "copy_task.step");
    const char *last = ag_safetensors_meta(file, "copy_task.last_check");
    const char *left = ag_safetensors_meta(file, "copy_task.heads");
    const char *tuned = ag_safetensors_meta(file, "copy_task.finetune_steps");
    bool ok = saved && step && last && strcmp(saved, run) == 0;
    if (!ok)
        snprintf(err->msg, sizeof err->msg, "%s: %s", path,
                 saved ? "saved by a run with other settings; resume with the same --task, "
                         "--length, model, --batch, --seed, --dropout and variant flags"
                       : "not a copy_task checkpoint (no copy_task.run metadata)");
    else if (!int_in_range(step, 0, STEPS_MAX, &rs->step) ||
             !int_in_range(last, -COOLDOWN, rs->step, &rs->last_check)) {
        ok = false;
        snprintf(err->msg, sizeof err->msg, "%s: copy_task.step '%.40s' and copy_task.last_check "
                 "'%.40s' must be integers, 0 <= step <= %d and %d <= last_check <= step",
                 path, step, last, STEPS_MAX, -COOLDOWN);
    } else if ((left || tuned) &&
               (!left || !tuned || !parse_heads(left, layers, heads, rs->heads) ||
                !int_in_range(tuned, 0, STEPS_MAX, &rs->finetuned))) {
        ok = false;
        snprintf(err->msg, sizeof err->msg, "%s: a pruned model's copy_task.heads '%.40s' and "
                 "copy_task.finetune_steps '%.40s' must be %d integer%s in [1, %d] separated by "
                 "commas, and an integer in [0, %d]", path, left ? left : "(none)",
                 tuned ? tuned : "(none)", layers, layers > 1 ? "s" : "", heads, STEPS_MAX);
    }
    for (int l = 0; ok && left && l < layers; l++) rs->pruned += heads - rs->heads[l];
    if (ok && left && rs->pruned == 0) {
        ok = false;
        snprintf(err->msg, sizeof err->msg, "%s: copy_task.heads '%s' prunes no head", path, left);
    }
    ag_safetensors_free(file);
    return ok;
}

bool run_load(const char *path, model *m, ag_optim *opt, const run_state *rs, ag_err *err) {
    ag_safetensors *file = NULL;
    if (ag_checkpoint_load(m->ps, ag_optim_state(opt), path, &file, err) != 0) return false;
    ag_safetensors_free(file);
    // Each training step is one Adam step (a step with a non-finite loss stops the run
    // unsaved); after pruning, each fine-tuning step is one step of a new Adam.
    long long taken = (long long)ag_optim_step_count(opt);
    int want = rs->pruned ? rs->finetuned : rs->step;
    if (taken != want) {
        snprintf(err->msg, sizeof err->msg, "%s: %s is %d, but the optimizer has taken %lld "
                 "steps: they must be equal", path,
                 rs->pruned ? "copy_task.finetune_steps" : "copy_task.step", want, taken);
        return false;
    }
    const ag_tensor *bad = ag_params_first_nonfinite(m->ps, false);
    if (bad)
        snprintf(err->msg, sizeof err->msg, "%s: parameter %s holds a NaN or an infinity", path,
                 bad->name);
    return bad == NULL;
}
