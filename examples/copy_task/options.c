#define _POSIX_C_SOURCE 200809L  // mkdir
#include "options.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/checkpoint.h"
#include "../common/dist.h"
#include "../common/dist_agree.h"
#include "../common/flags.h"
#include "../common/path.h"
#include "model.h"

#define USAGE "usage: copy_task [options]"
// The longest copy and reverse sequences (of 2 * length + 1 tokens) the demo takes.
#define MAX_LENGTH 500
// Recall's default length, in key-value pairs: its committed datasets'.
#define RECALL_LENGTH 8
// Recall's default learning rate: its one scored token per sequence makes its gradients
// noisier than the other tasks'.
#define RECALL_LR 0.003

// In the order of ag_task.
static const char *const tasks[] = {"copy", "reverse", "recall", NULL};

// The flags, one row each (see ../common/flags.h): saved ones (1) decide the run's
// numbers, and a checkpoint resumes only under the same; per-rank ones may differ
// between the processes of an MPI run.
static int table(options *o, flag *t) {
    flag all[] = {
        FLAG("--task", CHOICE, &o->task, 0, 0, 1, "the task", .choices = tasks),
        FLAG("--length", INT, &o->length, 1, MAX_LENGTH, 1, "symbols per half (copy, reverse: "
             "up to 500) or key-value pairs (recall: up to 16); the committed datasets' are "
             "16 (recall: 8), another length is generated from --seed"),
        FLAG("--d-model", INT, &o->d_model, 1, 4096, 1, "model width"),
        FLAG("--heads", INT, &o->heads, 1, 256, 1, "attention heads"),
        FLAG("--layers", INT, &o->layers, 1, MAX_LAYERS, 1, "attention layers (recall needs 2)"),
        FLAG("--batch", INT, &o->batch, 1, 65536, 1, "sequences per step (all processes)"),
        FLAG("--steps", INT, &o->steps, 1, STEPS_MAX, 0, "at most this many steps"),
        FLAG("--lr", REAL, &o->lr, 1e-9, 10, 0, "Adam learning rate (recall: 0.003 unless given; "
             "--resume: the checkpoint's unless given)"),
        FLAG("--dropout", REAL, &o->dropout, 0, 0.99, 1, "dropout on the attention weights"),
        FLAG("--seed", U64, &o->seed, 0, 2147483647, 1, "seeds initialisation, batches, dropout"),
        FLAG("--threads", INT, &o->threads, 1, 64, 0, "attograd threads", .per_rank = true),
        FLAG("--target-acc", REAL, &o->target_acc, 0, 1, 0, "stop once validation token "
             "accuracy reaches it (checked when a training batch reaches it, at most every 10 "
             "steps); 0 trains all --steps"),
        FLAG("--eval-every", INT, &o->eval_every, 1, 100000000, 0, "also validate every N steps"),
        FLAG("--cross", SWITCH, &o->cross, 0, 0, 1, "encoder-decoder: the second half attends to "
             "the first through cross-attention"),
        FLAG("--no-attention", SWITCH, &o->no_attention, 0, 0, 1, "replace every attention "
             "output with zeros (ablation)"),
        FLAG("--f64", SWITCH, &o->f64, 0, 0, 1, "train in float64 (slower; for checking)"),
        FLAG("--bf16", SWITCH, &o->bf16, 0, 0, 1,
             "matrix products in bfloat16 (autocast), the rest in float32"),
        FLAG("--profile", SWITCH, &o->profile, 0, 0, 0, "after training, time a forward and "
             "backward op by op"),
        FLAG("--analyze-heads", SWITCH, &o->analyze_heads, 0, 0, 0, "after training, print each "
             "head's entropy, distance, strongest pair and importance (gradient, ablation)"),
        FLAG("--prune", INT, &o->prune, 0, 255 * MAX_LAYERS, 0, "after training, prune the K "
             "heads of least ablation importance, then fine-tune (test accuracy before, after, "
             "and after fine-tuning)"),
        FLAG("--finetune-steps", INT, &o->finetune_steps, 0, STEPS_MAX, 0, "steps of "
             "fine-tuning after --prune"),
        FLAG("--pos", CHOICE, &o->pos, 0, 0, 1, "positions: none = a learned absolute table "
             "added to the embeddings; the others live inside every attention",
             .choices = flags_pos_choices("none")),
        FLAG("--test-length", INT, &o->test_length, 0, MAX_LENGTH, 0, "also test the trained "
             "model on generated data of this length (0: not)"),
        FLAG("--save", STRING, &o->save, 0, 0, 0, "save model, Adam state and progress "
             "(safetensors) at the end (with --prune: the pruned model, after fine-tuning)",
             .per_rank = true),
        FLAG("--save-every", INT, &o->save_every, 0, STEPS_MAX, 0, "with --save, also save "
             "every N training steps (0: only at the end)"),
        FLAG("--resume", STRING, &o->resume, 0, 0, 0, "continue a run saved with --save, up to "
             "--steps in all; it reaches the same numbers as a run never stopped (a pruned "
             "model is rebuilt with its heads and tested: its run is over)", .per_rank = true),
        FLAG("--data", STRING, &o->data, 0, 0, 0, "datasets directory",
             .per_rank = true),
        FLAG("--out", STRING, &o->out, 0, 0, 0, "where the CSV and the SVG go",
             .per_rank = true),
    };
    if (t) memcpy(t, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

// The committed datasets: ./datasets when run from the source tree, else the
// source tree's, found through the path compiled in. (A build tree has a
// datasets/ directory too, for the generator, so look for a data file.)
static const char *default_data_dir(void) {
    struct stat st;
    bool here = stat("datasets/copy/train.txt", &st) == 0 && S_ISREG(st.st_mode);
    return here ? "datasets" : AG_SOURCE_DIR "/datasets";
}

static void keep_message(const char *message, void *user) {
    ag_err *why = user;
    snprintf(why->msg, sizeof why->msg, "%s", message);
}

// Whether the heads of an attention with positions `pos` can be pruned, asked of the
// library on a module of two heads (false with its reason in why): a scheme whose terms
// follow from the head count (ALiBi's slopes) cannot be, and --prune with it trained, then
// aborted. Asked, not listed here, so that a scheme added to the library is asked too.
static bool pos_prunable(ag_pos_kind pos, ag_err *why) {
    *why = (ag_err){.msg = "cannot build the module"};
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(0, 0);
    ag_mha m;
    const ag_mha_config c = {.embed_dim = 4, .num_heads = 2, .pos = pos};
    ag_error_handler_set(keep_message, why);  // copy_task runs with the default handler
    const bool ok = ag_mha_init(&m, ps, "probe", &c, &rng) &&
                    ag_mha_prune_heads(&m, ps, (const int[]){0}, 1);
    ag_error_handler_set(NULL, NULL);
    ag_params_free(ps);
    return ok;
}

// What the flags cannot do together, caught before anything runs; false with one
// line in err.
static bool consistent(const options *o, ag_err *err) {
    // Each task's own limit, checked before any data is generated.
    const bool recall = o->task == AG_TASK_RECALL;
    const int max_length = recall ? AG_SEQ_MAX_PAIRS : MAX_LENGTH;
    const int head_dim = o->d_model / o->heads;
    const int prunable = o->layers * (o->heads - 1);  // pruning keeps a head in every layer
    ag_err why;
    if (o->length > max_length || o->test_length > max_length) {
        bool test = o->length <= max_length;
        snprintf(err->msg, sizeof err->msg, "%s %d is too long for task %s (at most %d%s)",
                 test ? "--test-length" : "--length", test ? o->test_length : o->length,
                 tasks[o->task], max_length, recall ? " key-value pairs" : "");
    } else if (o->d_model % o->heads != 0) {
        snprintf(err->msg, sizeof err->msg, "--d-model %d must be a multiple of --heads %d",
                 o->d_model, o->heads);
    } else if (o->pos == AG_POS_ROPE && head_dim % 2 != 0) {
        snprintf(err->msg, sizeof err->msg, "--pos rope rotates pairs of dimensions: a head's "
                 "--d-model %d / --heads %d = %d must be even", o->d_model, o->heads, head_dim);
    } else if (o->prune > prunable) {
        snprintf(err->msg, sizeof err->msg, "--prune %d would leave a layer with no head: %d "
                 "layer%s of %d heads can lose at most %d", o->prune, o->layers,
                 o->layers > 1 ? "s" : "", o->heads, prunable);
    } else if (o->prune && !o->no_attention && !pos_prunable((ag_pos_kind)o->pos, &why)) {
        snprintf(err->msg, sizeof err->msg, "--prune cannot work with --pos %s: %.300s",
                 flags_pos_choices("none")[o->pos], why.msg);
    } else if (o->no_attention && (o->prune || o->analyze_heads)) {
        // The heads' outputs are replaced with zeros: there is nothing to rank or prune,
        // and both were skipped without a word.
        snprintf(err->msg, sizeof err->msg, "%s has no heads to work on with --no-attention "
                 "(every attention output is zeros)", o->prune ? "--prune" : "--analyze-heads");
    } else if (o->save_every && !o->save) {
        snprintf(err->msg, sizeof err->msg, "--save-every needs --save");
    } else if (o->f64 && o->bf16) {  // it would train in float64, --bf16 silently dropped
        snprintf(err->msg, sizeof err->msg,
                 "--bf16 rounds the float32 products to bfloat16, but --f64 trains in "
                 "float64, which autocast leaves alone: give one of them");
    } else {
        return true;
    }
    return false;
}

// Rank 0 writes the files: where they go must work before any training.
static bool outputs_usable(const options *o, ag_err *err) {
    if (dist_rank() != 0) return true;
    if (o->save && !checkpoint_path_usable("--save", o->save, err)) return false;
    const size_t longest = strlen(o->out) + 1 + strlen(ag_task_name((ag_task)o->task)) +
                           strlen(OUT_LONGEST_SUFFIX);
    if (longest >= OUT_PATH_MAX) {
        snprintf(err->msg, sizeof err->msg, "--out %.200s...: the name is too long (%zu "
                 "bytes with its files' names, at most %d)", o->out, longest, OUT_PATH_MAX - 1);
        return false;
    }
    if (mkdir(o->out, 0777) != 0 && errno != EEXIST) {
        snprintf(err->msg, sizeof err->msg, "cannot create %.400s: %s", o->out, strerror(errno));
        return false;
    }
    // The CSV and the picture go in it: one of them a directory, say, was found only when
    // written, the picture after training, and the run still exited 0.
    char csv[OUT_PATH_MAX], svg[OUT_PATH_MAX];
    options_out_path(o, ".csv", csv, sizeof csv);
    options_out_path(o, "_attention.svg", svg, sizeof svg);
    return checkpoint_path_usable("--out", csv, err) &&
           (o->no_attention || checkpoint_path_usable("--out", svg, err));
}

void options_parse(options *o, int argc, char **argv) {
    *o = (options){.task = AG_TASK_COPY, .length = 16, .d_model = 64, .heads = 4, .layers = 1,
                   .batch = 64, .steps = 1000, .threads = 1, .eval_every = 100,
                   .finetune_steps = 100, .pos = AG_POS_NONE, .lr = 0.01, .target_acc = 0.999,
                   .seed = 1, .data = default_data_dir(), .out = "out"};
    flag flags[FLAGS_MAX];
    const int n = table(o, flags);
    dist_flags_parse(USAGE, flags, n, argc, argv);
    if (o->task == AG_TASK_RECALL && !flags_given(flags, n, "--length")) o->length = RECALL_LENGTH;
    o->lr_given = flags_given(flags, n, "--lr");
    if (o->task == AG_TASK_RECALL && !o->lr_given) o->lr = RECALL_LR;
    ag_err err;
    dist_check(!consistent(o, &err), 2, "%s", err.msg);
    // Fine-tuning follows pruning: without --prune, the steps asked were dropped unsaid.
    dist_check(flags_given(flags, n, "--finetune-steps") && !o->prune, 2,
               "--finetune-steps needs --prune");
    dist_agree_flags(flags, n);
    dist_check(!outputs_usable(o, &err), EXIT_FAILED, "%s", err.msg);
    char csv[OUT_PATH_MAX], svg[OUT_PATH_MAX];
    options_out_path(o, ".csv", csv, sizeof csv);
    options_out_path(o, "_attention.svg", svg, sizeof svg);
    // The task's splits under --data too: a --save onto one replaced the training data
    // with a checkpoint.
    char split[3][OUT_PATH_MAX + 16];
    const char *const split_names[3] = {"train", "valid", "test"};
    for (int i = 0; i < 3; i++)
        snprintf(split[i], sizeof split[i], "%.*s/%s/%s.txt", OUT_PATH_MAX - 16, o->data,
                 ag_task_name((ag_task)o->task), split_names[i]);
    const run_file files[] = {{"--resume", o->resume, false, NULL},
                              {"--save", o->save, true, "--resume"},
                              {"--out", csv, true, NULL},
                              {"--out", svg, true, NULL},
                              {"--data", split[0], false, NULL},
                              {"--data", split[1], false, NULL},
                              {"--data", split[2], false, NULL}};
    dist_check(!run_files_distinct(files, 7, &err), 2, "%s", err.msg);
}

void options_out_path(const options *o, const char *suffix, char *buf, size_t size) {
    snprintf(buf, size, "%s/%s%s", o->out, ag_task_name((ag_task)o->task), suffix);
}

const char *const *options_meta(const options *o, const char *const extra[]) {
    static flags_meta meta;
    options copy = *o;
    flag flags[FLAGS_MAX];
    const int n = table(&copy, flags);
    return flags_to_meta(&meta, flags, n, extra);
}

bool options_match_file(const options *o, const ag_safetensors *file, const char *path,
                        ag_err *err) {
    options copy = *o;
    flag flags[FLAGS_MAX];
    const int n = table(&copy, flags);
    return flags_check_file(flags, n, file, path, err);
}
