#include "heads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/dist.h"

#define SEQS_FOR_STATS 64
#define IMPORTANCE_BATCH 128

typedef struct {
    model *m;
    const ag_seqdata *d;
    batch *b;
} loss_ctx;

// The mean cross-entropy of validation batch `i` with the given head masks.
static ag_tensor *masked_loss(ag_tape *tp, ag_tensor *const masks[], int i, void *user) {
    loss_ctx *c = user;
    int first = i * c->b->cap, left = c->d->count - first;
    int n = left < c->b->cap ? left : c->b->cap;
    batch_fill(c->b, c->d, first, NULL, n, c->m->cfg.cross);
    model_input in = {.B = c->b->B, .T = c->b->T, .ids = c->b->ids, .S = c->b->S,
                      .source = c->b->source, .head_masks = masks};
    return ag_cross_entropy(tp, model_forward(tp, c->m, &in, NULL), c->b->targets,
                            (size_t)c->b->B * (size_t)c->b->T, AG_IGNORE_INDEX);
}

// w [B, h, T, S] with the rows of queries before `first` zeroed, which the statistics
// leave out as fully masked: the queries that predict the target half remain (the earlier
// ones, in causal attention, have few keys to choose from; query 0 has one, weight 1).
static ag_tensor *queries_from(ag_tape *tp, const ag_tensor *w, int first) {
    int T = w->shape[2], S = w->shape[3];
    ag_tensor *r = ag_tape_tensor(tp, w->dtype, 4, w->shape);
    for (size_t k = 0; k < w->numel; k++)
        if ((int)(k / (size_t)S % (size_t)T) >= first) ag_tensor_set_item(r, k, ag_tensor_item(w, k));
    return r;
}

bool heads_analyze(ag_tape *tp, model *m, const ag_seqdata *valid, FILE *f, double *gradient,
                   double *ablation) {
    int L = m->cfg.layers, H = m->attn[0].cfg.num_heads;
    batch b;
    batch_init(&b, valid, IMPORTANCE_BATCH, m->cfg.cross);
    loss_ctx c = {m, valid, &b};
    int batches = (valid->count + b.cap - 1) / b.cap;
    ag_dtype dt = ag_params_dtype(m->ps);
    bool ok = ag_head_importance_gradient(masked_loss, &c, dt, L, H, batches, gradient) &&
              ag_head_importance_ablation(masked_loss, &c, dt, L, H, batches, ablation);
    ag_params_zero_grad(m->ps);  // the gradient score's backward reached the weights too

    // The weights on the first validation sequences, for the table.
    int n = valid->count < SEQS_FOR_STATS ? valid->count : SEQS_FOR_STATS;
    batch_fill(&b, valid, 0, NULL, n, m->cfg.cross);
    ag_tensor *weights[MAX_LAYERS] = {0};
    bool was = ag_tape_set_grad_enabled(tp, false);
    ag_tape_reset(tp);
    model_input in = {.B = b.B, .T = b.T, .ids = b.ids, .S = b.S, .source = b.source};
    model_forward(tp, m, &in, weights);
    ag_tape_set_grad_enabled(tp, was);
    ag_head_stats *st = malloc(sizeof *st * (size_t)H);
    int first = m->cfg.cross ? 0 : valid->source_len;  // decoder-only: the target half
    for (int l = 0; ok && l < L; l++) {
        ok = ag_attention_head_stats(queries_from(tp, weights[l], first), st);
        fprintf(f, "layer %d (%s; queries %d.., %d validation sequences; importance over all "
                "%d):\n", l, m->cfg.cross ? "cross-attention" : "causal self-attention", first,
                n, valid->count);
        const double *imp[2] = {gradient + l * H, ablation + l * H};
        ag_attention_head_stats_print(st, H, imp, (const char *const[]){"|dL/dmask|", "ablation"},
                                      2, f);
    }
    free(st);
    batch_free(&b);
    return ok;
}

bool heads_prune(model *m, const double *ablation, int k, FILE *f) {
    int L = m->cfg.layers, H = m->attn[0].cfg.num_heads;
    bool *gone = calloc((size_t)L * H, sizeof *gone);
    int *left = malloc(sizeof(int) * (size_t)L);
    for (int l = 0; l < L; l++) left[l] = H;
    int pruned = 0;
    for (; pruned < k; pruned++) {  // the least important head whose layer keeps one
        int best = -1;
        for (int i = 0; i < L * H; i++)
            if (!gone[i] && left[i / H] > 1 && (best < 0 || ablation[i] < ablation[best]))
                best = i;
        if (best < 0) break;
        gone[best] = true;
        left[best / H]--;
    }
    bool ok = pruned == k;  // (main checks --prune against the layers before training)
    for (int l = 0; ok && l < L; l++) {
        int heads[256], n = 0;
        for (int j = 0; j < H; j++)
            if (gone[l * H + j]) heads[n++] = j;
        for (int i = 0; i < n; i++)
            fprintf(f, "pruned layer %d head %d (ablation importance %.4g)\n", l, heads[i],
                    ablation[l * H + heads[i]]);
        ok = ag_mha_prune_heads(&m->attn[l], m->ps, heads, n);
    }
    free(gone);
    free(left);
    return ok;
}

void heads_finetune(trainer *t, model *m, ag_optim *opt, const ag_seqdata *train,
                    const options *o) {
    for (int step = 0; step < o->finetune_steps; step++) {
        ag_pcg32 rng = ag_pcg32_make(o->seed, STREAM_FINETUNE + (uint64_t)step);
        uint64_t dropout_seed = o->seed * DROPOUT_PRIME_FINETUNE + (uint64_t)step;
        step_result r = trainer_step(t, m, opt, train, &rng, dropout_seed);
        step_check(&r, "fine-tuning step", step + 1, o->save != NULL);
    }
}

void heads_after_training(trainer *t, model *m, ag_optim **opt, const splits *data,
                          const options *o, bool prune, run_state *rs) {
    const int total_heads = m->cfg.layers * m->attn[0].cfg.num_heads;
    double *gradient = malloc(sizeof(double) * (size_t)total_heads);
    double *ablation = malloc(sizeof(double) * (size_t)total_heads);
    bool ranked = heads_analyze(t->tp, m, data->valid, stdout, gradient, ablation);
    dist_check(!ranked, EXIT_FAILED, "the validation loss is NaN: the heads cannot be ranked");
    if (prune) {
        const size_t params_before = ag_params_numel(m->ps);
        const double before = evaluate(t->tp, m, data->test).token_acc;
        dist_check(!heads_prune(m, ablation, o->prune, stdout), EXIT_FAILED, "pruning failed");
        const double after = evaluate(t->tp, m, data->test).token_acc;
        ag_optim_config oc = ag_optim_current_config(*opt);
        ag_optim_free(*opt);  // made for the store before pruning repacked it
        *opt = ag_optim_new(m->ps, &oc);
        heads_finetune(t, m, *opt, data->train, o);
        const double tuned = evaluate(t->tp, m, data->test).token_acc;
        printf("prune: %d of %d heads, %zu -> %zu parameters; test token_acc %.4f before, "
               "%.4f after, %.4f after %d fine-tuning steps\n", o->prune, total_heads,
               params_before, ag_params_numel(m->ps), before, after, tuned, o->finetune_steps);
        rs->pruned = o->prune;
        rs->finetuned = o->finetune_steps;
    }
    if (prune && o->save) {
        run_save(o, m, *opt, rs);
        printf("saved %s at step %d: the pruned model, after %d fine-tuning steps\n", o->save,
               rs->step, rs->finetuned);
    }
    free(gradient);
    free(ablation);
}
