// Training checkpoints: a run stopped at step k and resumed from its
// checkpoint into a fresh model and optimizer gives bit for bit the losses
// and parameters of the run that never stopped (SGD with momentum, Adam,
// AdamW, Lion, RMSprop; f32 and f64). The file means the same in PyTorch's terms, user
// metadata round-trips, a failed save keeps the previous checkpoint, and
// every bad or inconsistent file is refused with one line naming the file
// and the problem, leaving the parameters and the optimizer untouched.
#define _POSIX_C_SOURCE 200809L

#include "attograd/io.h"

#include <stdlib.h>

#include "testing.h"
#include "testing_files.h"

// ---- A small model and its training --------------------------------------------------
// Linear(6 -> 8), LayerNorm(8), ReLU, Linear(8 -> 4), cross-entropy.
enum { BATCH = 5, IN = 6, HIDDEN = 8, CLASSES = 4, STEPS = 12 };

typedef struct net {
    ag_params *ps;
    ag_linear_layer l1, l2;
    ag_layernorm_layer norm;
    ag_tape *tp;
    ag_optim *opt;  // when the test makes one for the net (freed with it)
} net;

static net *net_new(ag_dtype dt, uint64_t seed) {
    net *n = calloc(1, sizeof *n);
    n->ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(seed, 7);
    ag_linear_layer_init(&n->l1, n->ps, "l1", IN, HIDDEN, true, &rng);
    ag_layernorm_layer_init(&n->norm, n->ps, "norm", HIDDEN);
    ag_linear_layer_init(&n->l2, n->ps, "l2", HIDDEN, CLASSES, true, &rng);
    // LayerNorm starts at ones and zeros: move it so that its state is not trivial.
    ag_tensor_init_normal(n->norm.weight, &rng, 1, 0.1);
    ag_tensor_init_normal(n->norm.bias, &rng, 0, 0.1);
    n->tp = ag_tape_new();
    return n;
}

static void net_free(net *n) {
    ag_optim_free(n->opt);
    ag_tape_free(n->tp);
    ag_params_free(n->ps);
    free(n);
}

// One step on batch number `step`, drawn from its own pcg32 stream so that a
// resumed run sees the same data; returns the loss. At step 2 the learning
// rate is halved by hand, which a run resumed later must get from the file.
static double train_step(net *n, ag_optim *o, int step) {
    ag_tape_reset(n->tp);
    ag_params_zero_grad(n->ps);
    ag_pcg32 rng = ag_pcg32_make(99, (uint64_t)step);
    ag_tensor *x = ag_tape_tensor(n->tp, ag_params_dtype(n->ps), 2, (int[]){BATCH, IN});
    for (size_t i = 0; i < x->numel; i++) ag_tensor_set_item(x, i, 2 * ag_pcg32_double(&rng) - 1);
    int32_t targets[BATCH];  // learnable: the class is the largest of the first inputs
    for (int b = 0; b < BATCH; b++) {
        targets[b] = 0;
        for (int c = 1; c < CLASSES; c++)
            if (ag_tensor_item(x, (size_t)(b * IN + c)) > ag_tensor_item(x, (size_t)(b * IN + targets[b])))
                targets[b] = c;
    }
    ag_tensor *h = ag_linear_layer_forward(n->tp, &n->l1, x);
    h = ag_relu(n->tp, ag_layernorm_layer_forward(n->tp, &n->norm, h));
    ag_tensor *loss = ag_cross_entropy(n->tp, ag_linear_layer_forward(n->tp, &n->l2, h), targets,
                                       BATCH, AG_IGNORE_INDEX);
    ag_backward(n->tp, loss);
    if (step == 2) ag_optim_set_lr(o, ag_optim_lr(o) / 2);
    ag_optim_step(o);
    return ag_tensor_item(loss, 0);
}

static ag_optim_config config(ag_optim_kind kind) {
    ag_optim_config c = ag_optim_defaults(kind);
    c.lr = kind == AG_SGD ? 0.1 : 0.01;
    if (kind == AG_SGD) {
        c.momentum = 0.9;
        c.dampening = 0.1;
        c.weight_decay = 1e-3;
    }
    if (kind == AG_ADAM) c.weight_decay = 1e-3;
    if (kind == AG_LION) {
        c.lr = 1e-3;
        c.weight_decay = 0.1;
    }
    if (kind == AG_RMSPROP) {  // every buffer it can keep
        c.momentum = 0.9;
        c.centered = true;
        c.weight_decay = 1e-3;
    }
    return c;
}

// A model of `seed` with an optimizer of `kind` that has taken `steps`
// steps, on batches first, first + 1, ...
static net *made(ag_dtype dt, uint64_t seed, ag_optim_kind kind, int steps, int first) {
    net *n = net_new(dt, seed);
    ag_optim_config c = config(kind);
    n->opt = ag_optim_new(n->ps, &c);
    for (int s = 0; s < steps; s++) train_step(n, n->opt, first + s);
    return n;
}

// The run that saves: seed 1, steps from 0.
static net *trained(ag_dtype dt, ag_optim_kind kind, int steps) {
    return made(dt, 1, kind, steps, 0);
}

// Another model and optimizer, fresh.
static net *fresh(ag_optim_kind kind) { return made(AG_F32, 2, kind, 0, 0); }

static size_t buffer_bytes(const ag_params *ps) {
    return ag_params_buffer_len(ps) * ag_dtype_size(ag_params_dtype(ps));
}

static bool contains(const char *s, const char *part) {
    if (strstr(s, part)) return true;
    fprintf(stderr, "  message \"%s\"\n  lacks   \"%s\"\n", s, part);
    return false;
}

static bool saves(const ag_params *ps, ag_optim *o, const char *path,
                  const char *const meta[]) {
    ag_err err;
    if (ag_checkpoint_save(ps, ag_optim_state(o), path, meta, &err) == 0) return true;
    fprintf(stderr, "  save failed: %s\n", err.msg);
    return false;
}

static bool loads(ag_params *ps, ag_optim *o, const char *path) {
    ag_err err;
    if (ag_checkpoint_load(ps, ag_optim_state(o), path, NULL, &err) == 0) return true;
    fprintf(stderr, "  load failed: %s\n", err.msg);
    return false;
}

// ---- Resuming gives the same numbers -------------------------------------------------

// Trains STEPS steps, saving after step k; then a fresh model (another
// initialisation) and a fresh optimizer (the configured learning rate, not
// the halved one) load the checkpoint and train steps k..STEPS. Every loss,
// every parameter and every state value must have the same bits. With
// `used` > 0 the second optimizer has taken that many steps of its own
// before the load, which must overwrite all it holds.
static void check_resume(ag_dtype dt, ag_optim_kind kind, int k, int used) {
    const char *path = testing_path("resume.safetensors");
    net *a = made(dt, 1, kind, 0, 0);
    ag_optim *oa = a->opt;
    double loss_a[STEPS], loss_b[STEPS];
    void *at_k = malloc(buffer_bytes(a->ps));
    for (int s = 0; s < STEPS; s++) {
        if (s == k) {
            CHECK(saves(a->ps, oa, path, NULL));
            memcpy(at_k, ag_params_data(a->ps), buffer_bytes(a->ps));
        }
        loss_a[s] = train_step(a, oa, s);
    }

    net *b = made(dt, 2, kind, used, 100);
    ag_optim *ob = b->opt;
    CHECK(loads(b->ps, ob, path));
    CHECK(ag_optim_step_count(ob) == k);
    for (int s = k; s < STEPS; s++) loss_b[s] = train_step(b, ob, s);

    CHECK(memcmp(loss_a + k, loss_b + k, (size_t)(STEPS - k) * sizeof(double)) == 0);
    CHECK(memcmp(ag_params_data(a->ps), ag_params_data(b->ps), buffer_bytes(a->ps)) == 0);
    for (int i = 0; i < ag_optim_state_count(oa); i++)
        CHECK(memcmp(ag_optim_state_data(oa, i), ag_optim_state_data(ob, i),
                     buffer_bytes(a->ps)) == 0);
    CHECK(ag_optim_step_count(ob) == ag_optim_step_count(oa));
    CHECK(ag_optim_lr(ob) == ag_optim_lr(oa));
    CHECK(memcmp(ag_params_data(a->ps), at_k, buffer_bytes(a->ps)) != 0);  // steps did move them
    free(at_k);
    net_free(a);
    net_free(b);
}

static void test_resumed_adam_run_matches_the_uninterrupted_run_bit_for_bit(void) {
    check_resume(AG_F32, AG_ADAM, 5, 0);
}

static void test_resumed_adamw_run_matches_the_uninterrupted_run_bit_for_bit(void) {
    check_resume(AG_F32, AG_ADAMW, 5, 0);
}

static void test_resumed_sgd_momentum_run_matches_the_uninterrupted_run_bit_for_bit(void) {
    check_resume(AG_F32, AG_SGD, 5, 0);
}

// Lion was added with no change to the checkpoint code: it describes itself.
static void test_resumed_lion_run_matches_the_uninterrupted_run_bit_for_bit(void) {
    check_resume(AG_F32, AG_LION, 5, 0);
    check_resume(AG_F64, AG_LION, 7, 0);
    check_resume(AG_F32, AG_LION, 5, 3);
}

// RMSprop was added as a descriptor, with no change to optim.c, optim_state.c or io.
static void test_resumed_rmsprop_run_matches_the_uninterrupted_run_bit_for_bit(void) {
    check_resume(AG_F32, AG_RMSPROP, 5, 0);
    check_resume(AG_F64, AG_RMSPROP, 7, 0);
    check_resume(AG_F32, AG_RMSPROP, 5, 3);
    check_resume(AG_F32, AG_RMSPROP, 0, 3);
}

static void test_resumed_f64_runs_match_bit_for_bit(void) {
    check_resume(AG_F64, AG_ADAMW, 7, 0);
    check_resume(AG_F64, AG_SGD, 7, 0);
}

// Before its first step SGD has no momentum buffer: the first step after the
// load must set it to d, not decay zeros into it.
static void test_sgd_checkpoint_before_the_first_step_resumes_exactly(void) {
    check_resume(AG_F32, AG_SGD, 0, 0);
}

static void test_load_into_an_optimizer_that_has_taken_steps_replaces_all_it_holds(void) {
    check_resume(AG_F32, AG_SGD, 0, 3);
    check_resume(AG_F32, AG_SGD, 5, 3);
    check_resume(AG_F32, AG_ADAM, 5, 9);
}

static void test_checkpoint_taken_at_the_last_step_resumes_to_the_same_end(void) {
    check_resume(AG_F32, AG_ADAM, STEPS - 1, 0);
}

// ---- What the file holds ------------------------------------------------------------------

static void test_file_is_a_state_dict_with_optimizer_state_beside_it(void) {
    net *n = trained(AG_F32, AG_ADAM, 3);
    ag_optim *o = n->opt;
    ag_optim_set_lr(o, 1.0 / 3.0);  // needs all 17 digits
    const char *path = testing_path("layout.safetensors");
    CHECK(saves(n->ps, o, path, NULL));
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st != NULL);
    if (!st) return;
    CHECK(ag_safetensors_count(st) == 3 * ag_params_count(n->ps));
    for (int i = 0; i < ag_params_count(n->ps); i++) {
        const ag_tensor *p = ag_params_at(n->ps, i);
        const ag_tensor *v = ag_safetensors_find(st, p->name);
        CHECK(v && ag_tensor_same_shape(v, p) && v->dtype == AG_F32 &&
              memcmp(v->data, p->data, p->numel * sizeof(float)) == 0);
        const char *states[2] = {"exp_avg", "exp_avg_sq"};
        for (int s = 0; s < 2; s++) {
            char name[128];
            snprintf(name, sizeof name, "optimizer.%s.%s", states[s], p->name);
            const ag_tensor *t = ag_safetensors_find(st, name);
            size_t offset = (size_t)((const float *)p->data - (const float *)ag_params_data(n->ps));
            const float *want = (const float *)ag_optim_state_data(o, s) + offset;
            CHECK(t && ag_tensor_same_shape(t, p) && t->dtype == AG_F32 &&
                  memcmp(t->data, want, p->numel * sizeof(float)) == 0);
        }
    }
    CHECK(ag_safetensors_find(st, "optimizer.exp_avg.l1.weight") != NULL);
    CHECK(strcmp(ag_safetensors_meta(st, "optimizer"), "adam") == 0);
    CHECK(strcmp(ag_safetensors_meta(st, "optimizer.step"), "3") == 0);
    CHECK(strtod(ag_safetensors_meta(st, "optimizer.lr"), NULL) == 1.0 / 3.0);
    CHECK(strcmp(ag_safetensors_meta(st, "optimizer.beta1"), "0.9") == 0);  // fewest digits
    CHECK(strtod(ag_safetensors_meta(st, "optimizer.beta2"), NULL) == 0.999);
    CHECK(strtod(ag_safetensors_meta(st, "optimizer.eps"), NULL) == 1e-8);
    CHECK(strtod(ag_safetensors_meta(st, "optimizer.weight_decay"), NULL) == 1e-3);
    CHECK(ag_safetensors_meta(st, "optimizer.momentum") == NULL);
    ag_safetensors_free(st);

    // The learning rate comes back exactly.
    net *m = fresh(AG_ADAM);
    CHECK(loads(m->ps, m->opt, path));
    CHECK(ag_optim_lr(m->opt) == 1.0 / 3.0);
    net_free(m);
    net_free(n);
}

static void test_sgd_file_records_momentum_and_whether_it_started(void) {
    net *n = trained(AG_F32, AG_SGD, 0);
    ag_optim *o = n->opt;
    const char *path = testing_path("sgd.safetensors");
    ag_err err;
    CHECK(saves(n->ps, o, path, NULL));
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer"), "sgd") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.momentum_initialised"), "false") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.nesterov"), "false") == 0);
    CHECK(st && strtod(ag_safetensors_meta(st, "optimizer.momentum"), NULL) == 0.9);
    CHECK(st && strtod(ag_safetensors_meta(st, "optimizer.dampening"), NULL) == 0.1);
    CHECK(st && ag_safetensors_find(st, "optimizer.momentum_buffer.l2.bias") != NULL);
    ag_safetensors_free(st);
    train_step(n, o, 0);
    CHECK(saves(n->ps, o, path, NULL));
    st = ag_safetensors_load(path, &err);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.momentum_initialised"), "true") == 0);
    ag_safetensors_free(st);
    net_free(n);
}

static void test_rmsprop_file_records_its_settings_and_buffers(void) {
    net *n = trained(AG_F32, AG_RMSPROP, 2);
    const char *path = testing_path("rmsprop.safetensors");
    CHECK(saves(n->ps, n->opt, path, NULL));
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer"), "rmsprop") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.step"), "2") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.alpha"), "0.99") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.eps"), "1e-08") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.momentum"), "0.9") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.centered"), "true") == 0);
    CHECK(st && ag_safetensors_meta(st, "optimizer.momentum_initialised") == NULL);
    CHECK(st && ag_safetensors_count(st) == 4 * ag_params_count(n->ps));
    CHECK(st && ag_safetensors_find(st, "optimizer.square_avg.l1.weight") != NULL);
    CHECK(st && ag_safetensors_find(st, "optimizer.momentum_buffer.l1.weight") != NULL);
    CHECK(st && ag_safetensors_find(st, "optimizer.grad_avg.l1.weight") != NULL);
    ag_safetensors_free(st);
    net_free(n);
}

static void test_sgd_without_momentum_saves_no_state_tensors_and_resumes(void) {
    net *n = net_new(AG_F32, 1);
    ag_optim_config c = ag_optim_defaults(AG_SGD);
    c.lr = 0.05;
    ag_optim *o = n->opt = ag_optim_new(n->ps, &c);
    for (int s = 0; s < 3; s++) train_step(n, o, s);
    const char *path = testing_path("plain_sgd.safetensors");
    CHECK(saves(n->ps, o, path, NULL));
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st && ag_safetensors_count(st) == ag_params_count(n->ps));
    ag_safetensors_free(st);
    net *m = net_new(AG_F32, 2);
    ag_optim *o2 = m->opt = ag_optim_new(m->ps, &c);
    CHECK(loads(m->ps, o2, path));
    CHECK(ag_optim_step_count(o2) == 3 && ag_optim_lr(o2) == ag_optim_lr(o));
    CHECK(memcmp(ag_params_data(m->ps), ag_params_data(n->ps), buffer_bytes(n->ps)) == 0);
    net_free(m);
    net_free(n);
}

static void test_user_metadata_round_trips(void) {
    net *n = trained(AG_F32, AG_ADAMW, 2);
    ag_optim *o = n->opt;
    const char *path = testing_path("meta.safetensors");
    CHECK(saves(n->ps, o, path,
                (const char *[]){"epoch", "3", "data.position", "18446744073709551615",
                                 "note", "línea \"uno\"\n", NULL}));
    net *m = fresh(AG_ADAMW);
    ag_optim *o2 = m->opt;
    ag_safetensors *file = NULL;
    ag_err err;
    CHECK(ag_checkpoint_load(m->ps, ag_optim_state(o2), path, &file, &err) == 0);
    CHECK(file && strcmp(ag_safetensors_meta(file, "epoch"), "3") == 0);
    CHECK(file && strcmp(ag_safetensors_meta(file, "data.position"), "18446744073709551615") == 0);
    CHECK(file && strcmp(ag_safetensors_meta(file, "note"), "línea \"uno\"\n") == 0);
    ag_safetensors_free(file);
    // On failure the file pointer is cleared.
    file = (ag_safetensors *)&err;
    CHECK(ag_checkpoint_load(m->ps, ag_optim_state(o2), testing_path("absent.safetensors"), &file, &err) != 0);
    CHECK(file == NULL);
    net_free(m);
    net_free(n);
}

// The decay groups travel with the optimizer state: a file lists the parameters
// that do not decay, and loading it sets the store's groups to the file's.
static void test_decay_groups_are_recorded_and_restored(void) {
    net *n = trained(AG_F32, AG_ADAMW, 2);
    ag_params_decay_matrices_only(n->ps);
    ag_params_set_decay(n->ps, n->l2.weight, false);
    const char *path = testing_path("groups.safetensors");
    CHECK(saves(n->ps, n->opt, path, NULL));
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    const char *v = st ? ag_safetensors_meta(st, "optimizer.no_decay") : NULL;
    CHECK(v && strcmp(v, "[\"l1.bias\",\"norm.weight\",\"norm.bias\",\"l2.weight\",\"l2.bias\"]") == 0);
    ag_safetensors_free(st);
    net *m = fresh(AG_ADAMW);  // every parameter decays
    CHECK(loads(m->ps, m->opt, path));
    for (int i = 0; i < ag_params_count(m->ps); i++)
        CHECK(ag_params_decays(m->ps, ag_params_at(m->ps, i)) ==
              ag_params_decays(n->ps, ag_params_at(n->ps, i)));
    // A file without the key: every parameter decays again.
    net *k = trained(AG_F32, AG_ADAMW, 1);
    CHECK(saves(k->ps, k->opt, path, NULL));
    CHECK(loads(m->ps, m->opt, path));
    for (int i = 0; i < ag_params_count(m->ps); i++) CHECK(ag_params_decays(m->ps, ag_params_at(m->ps, i)));
    net_free(k), net_free(m), net_free(n);
}

static void test_decay_group_naming_no_parameter_is_refused(void) {
    net *n = trained(AG_F32, AG_ADAMW, 1);
    const char *path = testing_path("groups_bad.safetensors");
    CHECK(saves(n->ps, n->opt, path, NULL));
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st && ag_safetensors_set_meta(st, "optimizer.no_decay", "[\"l1.bias\",\"nope\"]", &err) == 0);
    CHECK(st && ag_safetensors_save(st, path, &err) == 0);
    ag_safetensors_free(st);
    net *m = fresh(AG_ADAMW);
    CHECK(ag_checkpoint_load(m->ps, ag_optim_state(m->opt), path, NULL, &err) != 0);
    CHECK(contains(err.msg, "metadata optimizer.no_decay names 'nope', which is not a parameter"));
    CHECK(ag_params_decays(m->ps, m->l1.bias));  // nothing changed
    net_free(m), net_free(n);
}

// Longer than any scalar (71 characters): the checkpoint asks the state again with room.
static void test_decay_group_of_every_parameter_round_trips(void) {
    net *n = trained(AG_F32, AG_ADAMW, 1);
    for (int i = 0; i < ag_params_count(n->ps); i++)
        ag_params_set_decay(n->ps, ag_params_at(n->ps, i), false);
    const char *path = testing_path("groups_all.safetensors");
    CHECK(saves(n->ps, n->opt, path, NULL));
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    const char *v = st ? ag_safetensors_meta(st, "optimizer.no_decay") : NULL;
    CHECK(v && strcmp(v, "[\"l1.weight\",\"l1.bias\",\"norm.weight\",\"norm.bias\",\"l2.weight\","
                         "\"l2.bias\"]") == 0);
    ag_safetensors_free(st);
    net *m = fresh(AG_ADAMW);
    CHECK(loads(m->ps, m->opt, path));
    for (int i = 0; i < ag_params_count(m->ps); i++)
        CHECK(!ag_params_decays(m->ps, ag_params_at(m->ps, i)));
    net_free(m), net_free(n);
}

static void test_decay_group_that_is_no_list_of_names_is_refused(void) {
    net *n = trained(AG_F32, AG_ADAMW, 1);
    const char *path = testing_path("groups_garbage.safetensors");
    CHECK(saves(n->ps, n->opt, path, NULL));
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st && ag_safetensors_set_meta(st, "optimizer.no_decay", "[\"l1.bias\",3]", &err) == 0);
    CHECK(st && ag_safetensors_save(st, path, &err) == 0);
    ag_safetensors_free(st);
    net *m = fresh(AG_ADAMW);
    CHECK(ag_checkpoint_load(m->ps, ag_optim_state(m->opt), path, NULL, &err) != 0);
    CHECK(contains(err.msg, "metadata 'optimizer.no_decay' is '[\"l1.bias\",3]'; expected a JSON "
                            "array of parameter names"));
    CHECK(ag_params_decays(m->ps, m->l1.bias));  // nothing changed
    net_free(m), net_free(n);
}

// ---- Any state: io stores its strings and tensors without knowing what they mean -------
// A state that is no optimizer, with a per-parameter setting of its own: io was not
// edited for it. The setting is one long string (longer than any scalar: the checkpoint
// asks again with room for it) and the state keeps one buffer.
typedef struct scaled_state {
    const ag_params *ps;
    char lr_scales[256];  // "l1.weight=0.5,l1.bias=0.25,..."
    void *velocity;       // ag_params_buffer_len elements of the store's dtype
    int restores;
} scaled_state;

static const char *scaled_kind(const void *self) { return (void)self, "scaled"; }
static const ag_params *scaled_store(const void *self, size_t *len) {
    *len = ag_params_buffer_len(((const scaled_state *)self)->ps);
    return ((const scaled_state *)self)->ps;
}
static int scaled_n_values(const void *self) { return (void)self, 1; }
static size_t scaled_value(const void *self, int i, const char **key, char *buf, size_t size) {
    const scaled_state *s = self;
    (void)i;
    *key = "lr_scales";
    size_t len = strlen(s->lr_scales);
    if (len < size) memcpy(buf, s->lr_scales, len + 1);
    return len;
}
static int scaled_n_buffers(const void *self) { return (void)self, 1; }
static const char *scaled_buffer_name(const void *self, int i) {
    return (void)self, (void)i, "velocity";
}
static void *scaled_buffer_data(const void *self, int i) {
    return (void)i, ((const scaled_state *)self)->velocity;
}
static int scaled_restore(void *self, const ag_state_source *src, bool apply, ag_err *err) {
    scaled_state *s = self;
    const char *v = src->get(src->ctx, "lr_scales");
    if (!v || strlen(v) >= sizeof s->lr_scales) {
        snprintf(err->msg, sizeof err->msg, "metadata '%slr_scales' is missing or too long",
                 src->prefix);
        return -1;
    }
    if (apply) snprintf(s->lr_scales, sizeof s->lr_scales, "%s", v), s->restores++;
    return 0;
}

static ag_state scaled_describe(scaled_state *s, const ag_params *ps) {
    s->ps = ps;
    s->velocity = calloc(ag_params_buffer_len(ps), ag_dtype_size(ag_params_dtype(ps)));
    return (ag_state){s, scaled_kind, scaled_store, scaled_n_values, scaled_value,
                      scaled_n_buffers, scaled_buffer_name, scaled_buffer_data, scaled_restore};
}

static void test_a_state_of_any_kind_round_trips_its_settings_and_buffers(void) {
    net *n = trained(AG_F32, AG_ADAM, 1);
    scaled_state a = {0}, b = {0};
    ag_state sa = scaled_describe(&a, n->ps), sb = scaled_describe(&b, n->ps);
    for (int i = 0, k = 0; i < ag_params_count(n->ps); i++)
        k += snprintf(a.lr_scales + k, sizeof a.lr_scales - (size_t)k, "%s%s=%g", i ? "," : "",
                      ag_params_at(n->ps, i)->name, 1.0 / (i + 1));
    CHECK(strlen(a.lr_scales) > 64);
    for (size_t i = 0; i < ag_params_buffer_len(n->ps); i++)
        ((float *)a.velocity)[i] = (float)i / 8;
    const char *path = testing_path("scaled.safetensors");
    ag_err err;
    CHECK(ag_checkpoint_save(n->ps, &sa, path, NULL, &err) == 0);
    ag_safetensors *st = ag_safetensors_load(path, &err);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer"), "scaled") == 0);
    CHECK(st && strcmp(ag_safetensors_meta(st, "optimizer.lr_scales"), a.lr_scales) == 0);
    CHECK(st && ag_safetensors_find(st, "optimizer.velocity.l2.bias") != NULL);
    ag_safetensors_free(st);
    CHECK(ag_checkpoint_load(n->ps, &sb, path, NULL, &err) == 0);
    CHECK(b.restores == 1 && strcmp(b.lr_scales, a.lr_scales) == 0);
    for (int i = 0; i < ag_params_count(n->ps); i++) {  // the parameters' slices, not the padding
        const ag_tensor *t = ag_params_at(n->ps, i);
        size_t at = (size_t)((const char *)t->data - (const char *)ag_params_data(n->ps));
        const char *was = (const char *)a.velocity + at, *now = (const char *)b.velocity + at;
        CHECK(memcmp(was, now, t->numel * sizeof(float)) == 0);
    }
    // An Adam optimizer is another kind: refused, naming both.
    CHECK(ag_checkpoint_load(n->ps, ag_optim_state(n->opt), path, NULL, &err) != 0);
    CHECK(contains(err.msg, "the file holds scaled optimizer state but the optimizer is adam"));
    free(a.velocity), free(b.velocity);
    net_free(n);
}

// Settings are key/value strings of any length (README, Design decisions): a state whose
// key is 300 characters long saves, and its checkpoint loads with the value found.
typedef struct long_key_state {
    const ag_params *ps;
    char key[301], value[16];
} long_key_state;

static const char *long_key_kind(const void *self) { return (void)self, "long_key"; }
static const ag_params *long_key_store(const void *self, size_t *len) {
    *len = ag_params_buffer_len(((const long_key_state *)self)->ps);
    return ((const long_key_state *)self)->ps;
}
static int long_key_n_values(const void *self) { return (void)self, 1; }
static size_t long_key_value(const void *self, int i, const char **key, char *buf, size_t size) {
    const long_key_state *s = self;
    (void)i;
    *key = s->key;
    size_t len = strlen(s->value);
    if (len < size) memcpy(buf, s->value, len + 1);
    return len;
}
static int long_key_n_buffers(const void *self) { return (void)self, 0; }
static int long_key_restore(void *self, const ag_state_source *src, bool apply, ag_err *err) {
    long_key_state *s = self;
    const char *v = src->get(src->ctx, s->key);
    if (!v || strlen(v) >= sizeof s->value) {
        snprintf(err->msg, sizeof err->msg, "metadata '%s<300 x k>' is missing or too long",
                 src->prefix);
        return -1;
    }
    if (apply) snprintf(s->value, sizeof s->value, "%s", v);
    return 0;
}

static void test_a_setting_with_a_long_key_round_trips(void) {
    net *n = net_new(AG_F32, 3);
    long_key_state a = {.ps = n->ps, .value = "saved"}, b = {.ps = n->ps, .value = "fresh"};
    memset(a.key, 'k', 300);
    memcpy(b.key, a.key, sizeof a.key);
    ag_state sa = {&a, long_key_kind, long_key_store, long_key_n_values, long_key_value,
                   long_key_n_buffers, NULL, NULL, long_key_restore};
    ag_state sb = sa;
    sb.self = &b;
    const char *path = testing_path("long_key.safetensors");
    ag_err err = {{0}};
    CHECK(ag_checkpoint_save(n->ps, &sa, path, NULL, &err) == 0);
    CHECK(ag_checkpoint_load(n->ps, &sb, path, NULL, &err) == 0);
    if (err.msg[0]) fprintf(stderr, "  %s\n", err.msg);
    CHECK(strcmp(b.value, "saved") == 0);
    net_free(n);
}

// state.h promises restore an err to write: a state that clears it on every call (as
// many a C function clears its error output first) loads without a crash.
static int clearing_restore(void *self, const ag_state_source *src, bool apply, ag_err *err) {
    err->msg[0] = '\0';
    return long_key_restore(self, src, apply, err);
}

static void test_a_state_that_always_writes_its_error_loads(void) {
    net *n = net_new(AG_F32, 3);
    long_key_state a = {.ps = n->ps, .key = "k", .value = "saved"};
    long_key_state b = {.ps = n->ps, .key = "k", .value = "fresh"};
    ag_state sa = {&a, long_key_kind, long_key_store, long_key_n_values, long_key_value,
                   long_key_n_buffers, NULL, NULL, clearing_restore};
    ag_state sb = sa;
    sb.self = &b;
    const char *path = testing_path("clearing.safetensors");
    ag_err err;
    CHECK(ag_checkpoint_save(n->ps, &sa, path, NULL, &err) == 0);
    CHECK(ag_checkpoint_load(n->ps, &sb, path, NULL, &err) == 0);
    CHECK(strcmp(b.value, "saved") == 0);
    net_free(n);
}

// ---- Checkpoints without an optimizer ------------------------------------------------------

static void test_model_only_checkpoint_is_what_params_save_writes(void) {
    net *n = net_new(AG_F32, 1);
    const char *a = testing_path("model_a.safetensors"), *b = testing_path("model_b.safetensors");
    const char *meta[] = {"epoch", "1", NULL};
    CHECK(saves(n->ps, NULL, a, meta));
    ag_err err;
    CHECK(ag_params_save(n->ps, b, meta, &err) == 0);
    size_t na, nb;
    unsigned char *ba = testing_read_file(a, &na), *bb = testing_read_file(b, &nb);
    CHECK(ba && bb && na == nb && memcmp(ba, bb, na) == 0);
    free(ba);
    free(bb);
    net *m = net_new(AG_F32, 2);
    CHECK(loads(m->ps, NULL, a));
    CHECK(memcmp(ag_params_data(m->ps), ag_params_data(n->ps), buffer_bytes(n->ps)) == 0);
    net_free(m);
    net_free(n);
}

static void test_without_an_optimizer_only_the_parameters_load(void) {
    net *n = trained(AG_F32, AG_ADAM, 3);
    ag_optim *o = n->opt;
    const char *path = testing_path("weights.safetensors");
    CHECK(saves(n->ps, o, path, NULL));
    net *m = net_new(AG_F32, 2);
    CHECK(loads(m->ps, NULL, path));
    CHECK(memcmp(ag_params_data(m->ps), ag_params_data(n->ps), buffer_bytes(n->ps)) == 0);
    // A strict ag_params_load sees the optimizer's tensors as unexpected.
    ag_err err;
    CHECK(ag_params_load(m->ps, path, &err) != 0);
    CHECK(contains(err.msg, "unexpected tensors: 'optimizer.exp_avg.l1.bias'"));
    net_free(m);
    net_free(n);
}

// ---- Refused files change nothing ---------------------------------------------------------

// Everything a load could change.
typedef struct snapshot {
    unsigned char *data, *grad, *state[3];  // at most 3 buffers (RMSprop)
    size_t bytes;
    int n_state;
    int64_t step;
    double lr;
    bool initialised;
} snapshot;

static snapshot take(const ag_params *ps, const ag_optim *o) {
    snapshot s = {0};
    s.bytes = buffer_bytes(ps);
    s.data = malloc(s.bytes);
    s.grad = malloc(s.bytes);
    memcpy(s.data, ag_params_data(ps), s.bytes);
    memcpy(s.grad, ag_params_grad(ps), s.bytes);
    s.n_state = ag_optim_state_count(o);
    for (int i = 0; i < s.n_state; i++) {
        s.state[i] = malloc(s.bytes);
        memcpy(s.state[i], ag_optim_state_data(o, i), s.bytes);
    }
    s.step = ag_optim_step_count(o);
    s.lr = ag_optim_lr(o);
    s.initialised = ag_optim_momentum_initialised(o);
    return s;
}

static bool unchanged(const ag_params *ps, const ag_optim *o, snapshot s) {
    bool same = memcmp(s.data, ag_params_data(ps), s.bytes) == 0 &&
                memcmp(s.grad, ag_params_grad(ps), s.bytes) == 0 &&
                s.step == ag_optim_step_count(o) && s.lr == ag_optim_lr(o) &&
                s.initialised == ag_optim_momentum_initialised(o);
    for (int i = 0; i < s.n_state; i++) {
        same = same && memcmp(s.state[i], ag_optim_state_data(o, i), s.bytes) == 0;
        free(s.state[i]);
    }
    free(s.data);
    free(s.grad);
    return same;
}

// Another model and optimizer with state of their own (2 steps), which a
// refused load must leave as they are.
static net *target_new(ag_optim_kind kind) { return made(AG_F32, 2, kind, 2, 10); }

// Loading `path` into a fresh target of `kind` fails with one line that
// starts with the path and contains `problem`, and changes nothing.
static void expect_refused_as(ag_optim_kind kind, const char *path, const char *problem,
                              int line) {
    net *t = target_new(kind);
    snapshot before = take(t->ps, t->opt);
    ag_err err = {{0}};
    int rc = ag_checkpoint_load(t->ps, ag_optim_state(t->opt), path, NULL, &err);
    bool ok = rc != 0 && strncmp(err.msg, path, strlen(path)) == 0 &&
              contains(err.msg, problem) && !strchr(err.msg, '\n');
    ok = unchanged(t->ps, t->opt, before) && ok;
    if (!ok) {
        char m[700];
        snprintf(m, sizeof m, "line %d: load of %s: rc %d, message \"%s\"", line, path, rc,
                 err.msg);
        testing_fail(__FILE__, __LINE__, m);
    }
    net_free(t);
}

#define EXPECT_REFUSED(kind, path, problem) expect_refused_as(kind, path, problem, __LINE__)

// A good Adam checkpoint (step 3) of the model, as a set to edit.
static ag_safetensors *good_set(ag_optim_kind kind) {
    net *n = trained(AG_F32, kind, 3);
    ag_optim *o = n->opt;
    const char *path = testing_path("good.safetensors");
    CHECK(saves(n->ps, o, path, (const char *[]){"epoch", "1", NULL}));
    net_free(n);
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    if (!st) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    return st;
}

// A copy of `st` without the tensor or metadata key `drop` (NULL: a full copy).
static ag_safetensors *without(const ag_safetensors *st, const char *drop) {
    ag_safetensors *out = ag_safetensors_new();
    ag_err err;
    for (int i = 0; i < ag_safetensors_count(st); i++)
        if (!drop || strcmp(ag_safetensors_name(st, i), drop) != 0)
            CHECK(ag_safetensors_add(out, ag_safetensors_name(st, i), ag_safetensors_at(st, i),
                                     &err) == 0);
    for (int i = 0; i < ag_safetensors_meta_count(st); i++)
        if (!drop || strcmp(ag_safetensors_meta_key(st, i), drop) != 0)
            CHECK(ag_safetensors_set_meta(out, ag_safetensors_meta_key(st, i),
                                          ag_safetensors_meta_value(st, i), &err) == 0);
    return out;
}

// Saves `st` as `name` in the scratch directory, frees it, returns the path.
static const char *written(ag_safetensors *st, const char *name) {
    const char *path = testing_path(name);
    ag_err err;
    CHECK(ag_safetensors_save(st, path, &err) == 0);
    ag_safetensors_free(st);
    return path;
}

static void add_f32(ag_safetensors *st, const char *name, int ndim, const int shape[],
                    ag_dtype dt) {
    ag_tensor *t = ag_tensor_zeros(dt, ndim, shape);
    ag_err err;
    CHECK(ag_safetensors_add(st, name, t, &err) == 0);
    ag_tensor_free(t);
}

static void test_load_refuses_missing_misshapen_or_stray_parameters(void) {
    ag_safetensors *good = good_set(AG_ADAM);
    EXPECT_REFUSED(AG_ADAM, written(without(good, "l2.bias"), "p1.safetensors"),
                   ": missing 1 of 6 parameters: 'l2.bias'");
    ag_safetensors *st = without(good, "norm.weight");
    add_f32(st, "norm.weight", 1, (int[]){9}, AG_F32);
    EXPECT_REFUSED(AG_ADAM, written(st, "p2.safetensors"),
                   ": size mismatch for 'norm.weight': [9] in the file, [8] in the model");
    st = without(good, "norm.weight");
    add_f32(st, "norm.weight", 1, (int[]){8}, AG_I32);
    EXPECT_REFUSED(AG_ADAM, written(st, "p3.safetensors"),
                   ": 'norm.weight' is I32 in the file; parameters load from F32 or F64");
    st = without(good, NULL);
    add_f32(st, "head.weight", 1, (int[]){8}, AG_F32);
    EXPECT_REFUSED(AG_ADAM, written(st, "p4.safetensors"), ": 1 unexpected tensor: 'head.weight'");
    ag_safetensors_free(good);
}

// `good` (a checkpoint of `kind`) with metadata key = value is refused.
static void expect_bad_meta(ag_optim_kind kind, const ag_safetensors *good, const char *key,
                            const char *value, const char *expected) {
    ag_safetensors *st = without(good, NULL);
    ag_err err;
    CHECK(ag_safetensors_set_meta(st, key, value, &err) == 0);
    char want[200];
    snprintf(want, sizeof want, ": metadata '%s' is '%s'; %s", key, value, expected);
    EXPECT_REFUSED(kind, written(st, "bad_meta.safetensors"), want);
}

// RFC 3629 UTF-8, strictly enough for a test: lead bytes and their continuations.
static bool utf8(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int more = *p < 0x80 ? 0 : (*p & 0xE0) == 0xC0 ? 1 : (*p & 0xF0) == 0xE0 ? 2
                 : (*p & 0xF8) == 0xF0 ? 3 : -1;
        if (more < 0) return false;
        for (p++; more > 0; more--, p++)
            if ((*p & 0xC0) != 0x80) return false;
    }
    return true;
}

// A bad setting's value is shown cut to fit the line, by whole characters: the message
// stays UTF-8 whichever byte the cut falls on.
static void test_a_long_bad_value_is_cut_between_characters(void) {
    ag_safetensors *good = good_set(AG_ADAM);
    for (int lead = 0; lead < 3; lead++) {
        char value[200];
        int k = snprintf(value, sizeof value, "%.*s", lead, "xx");
        for (int i = 0; i < 40; i++) k += snprintf(value + k, sizeof value - (size_t)k, "\xe2\x82\xac");
        ag_safetensors *st = without(good, NULL);
        ag_err err;
        CHECK(ag_safetensors_set_meta(st, "optimizer.lr", value, &err) == 0);
        net *m = fresh(AG_ADAM);
        CHECK(ag_checkpoint_load(m->ps, ag_optim_state(m->opt), written(st, "cut.safetensors"),
                                 NULL, &err) != 0);
        CHECK(contains(err.msg, "...'; expected a finite number >= 0"));
        CHECK(utf8(err.msg));
        net_free(m);
    }
    ag_safetensors_free(good);
}

static void test_load_refuses_another_optimizer_naming_both(void) {
    ag_safetensors *good = good_set(AG_ADAM);
    const char *path = written(without(good, NULL), "kind.safetensors");
    EXPECT_REFUSED(AG_ADAMW, path, ": the file holds adam optimizer state but the optimizer is adamw");
    EXPECT_REFUSED(AG_SGD, path, ": the file holds adam optimizer state but the optimizer is sgd");
    // The checkpoint knows no list of kinds: any other name is another optimizer's.
    CHECK(ag_safetensors_set_meta(good, "optimizer", "rmsprop", NULL) == 0);
    EXPECT_REFUSED(AG_ADAM, written(without(good, NULL), "kind2.safetensors"),
                   ": the file holds rmsprop optimizer state but the optimizer is adam");
    CHECK(ag_safetensors_set_meta(good, "optimizer", "adam", NULL) == 0);
    EXPECT_REFUSED(AG_ADAM, written(without(good, "optimizer"), "kind3.safetensors"),
                   ": the file has 'optimizer.' tensors but no metadata 'optimizer'");
    ag_safetensors_free(good);
}

static void test_model_only_file_with_an_optimizer_is_refused(void) {
    net *n = net_new(AG_F32, 1);
    const char *path = testing_path("model_only.safetensors");
    CHECK(saves(n->ps, NULL, path, NULL));
    net_free(n);
    EXPECT_REFUSED(AG_ADAM, path,
                   ": the file has no optimizer state (a model-only checkpoint) but adam state "
                   "was asked for; load it with a NULL optimizer");
}

static void test_load_refuses_bad_step_learning_rate_or_flag(void) {
    ag_safetensors *good = good_set(AG_ADAM);
    EXPECT_REFUSED(AG_ADAM, written(without(good, "optimizer.step"), "m1.safetensors"),
                   ": metadata 'optimizer.step' is missing");
    static const char *const bad_steps[] = {"", "-1", "+3", " 3", "3.0", "3x", "1e3",
                                            "99999999999999999999",
                                            // the next step would overflow, or lose exactness
                                            "9223372036854775807", "9007199254740993"};
    for (size_t i = 0; i < sizeof bad_steps / sizeof bad_steps[0]; i++)
        expect_bad_meta(AG_ADAM, good, "optimizer.step", bad_steps[i], "expected a whole number");
    static const char *const bad_lrs[] = {"", "-0.1", "nan", "inf", "0.1 ", "fast"};
    for (size_t i = 0; i < sizeof bad_lrs / sizeof bad_lrs[0]; i++)
        expect_bad_meta(AG_ADAM, good, "optimizer.lr", bad_lrs[i], "expected a finite number");
    ag_safetensors_free(good);

    good = good_set(AG_SGD);
    expect_bad_meta(AG_SGD, good, "optimizer.momentum_initialised", "yes", "expected true or false");
    expect_bad_meta(AG_SGD, good, "optimizer.momentum", "-0.9", "expected a number >= 0");
    expect_bad_meta(AG_SGD, good, "optimizer.momentum_not_started", "[3]",
                    "expected a JSON array of parameter names");
    ag_safetensors *unknown = without(good, NULL);
    ag_err err;
    CHECK(ag_safetensors_set_meta(unknown, "optimizer.momentum_not_started", "[\"nope\"]", &err) == 0);
    EXPECT_REFUSED(AG_SGD, written(unknown, "m6.safetensors"),
                   ": metadata optimizer.momentum_not_started names 'nope', which is not a parameter");
    EXPECT_REFUSED(AG_SGD, written(without(good, "optimizer.momentum"), "m5.safetensors"),
                   ": metadata 'optimizer.momentum' is missing");
    ag_safetensors_free(good);
}

static void test_load_refuses_missing_or_misshapen_state(void) {
    ag_safetensors *good = good_set(AG_ADAM);
    EXPECT_REFUSED(AG_ADAM,
                   written(without(good, "optimizer.exp_avg_sq.l1.weight"), "s1.safetensors"),
                   ": optimizer state: missing 1 of 6 parameters: 'optimizer.exp_avg_sq.l1.weight'");
    ag_safetensors *st = without(good, "optimizer.exp_avg.l1.weight");
    add_f32(st, "optimizer.exp_avg.l1.weight", 2, (int[]){6, 8}, AG_F32);
    EXPECT_REFUSED(AG_ADAM, written(st, "s2.safetensors"),
                   ": optimizer state: size mismatch for 'optimizer.exp_avg.l1.weight': [6,8] in "
                   "the file, [8,6] in the model");
    st = without(good, "optimizer.exp_avg.l2.bias");
    add_f32(st, "optimizer.exp_avg.l2.bias", 1, (int[]){4}, AG_U8);
    EXPECT_REFUSED(AG_ADAM, written(st, "s3.safetensors"),
                   ": optimizer state: 'optimizer.exp_avg.l2.bias' is U8 in the file");
    st = without(good, NULL);
    add_f32(st, "optimizer.exp_avg.l3.bias", 1, (int[]){4}, AG_F32);
    EXPECT_REFUSED(AG_ADAM, written(st, "s4.safetensors"),
                   ": optimizer state: 1 unexpected tensor: 'optimizer.exp_avg.l3.bias'");
    ag_safetensors_free(good);
}

static void test_load_refuses_stray_optimizer_tensors(void) {
    ag_safetensors *good = good_set(AG_ADAM);
    ag_safetensors *st = without(good, NULL);
    add_f32(st, "optimizer.momentum_buffer.l1.bias", 1, (int[]){8}, AG_F32);
    add_f32(st, "optimizer.step", 0, NULL, AG_I64);
    EXPECT_REFUSED(AG_ADAM, written(st, "x1.safetensors"),
                   ": 2 unexpected optimizer tensors, the first 'optimizer.momentum_buffer.l1.bias' "
                   "(adam keeps only optimizer.exp_avg.* and optimizer.exp_avg_sq.*)");
    ag_safetensors_free(good);
}

// SGD without momentum has no buffer: its file cannot feed an SGD with one,
// nor the other way round.
static void test_load_refuses_sgd_momentum_mismatch(void) {
    net *n = net_new(AG_F32, 1);
    ag_optim_config c = ag_optim_defaults(AG_SGD);
    c.lr = 0.1;
    ag_optim *plain = ag_optim_new(n->ps, &c);
    const char *path = testing_path("plain.safetensors");
    CHECK(saves(n->ps, plain, path, NULL));
    EXPECT_REFUSED(AG_SGD, path,
                   ": the file's sgd has momentum 0 but the optimizer's has momentum 0.9: one "
                   "has a momentum buffer and the other has none");
    ag_optim_free(plain);
    net_free(n);
}

// A centered RMSprop keeps grad_avg and a plain one does not: neither file feeds
// the other.
static void test_load_refuses_rmsprop_centered_mismatch(void) {
    ag_safetensors *good = good_set(AG_RMSPROP);
    ag_safetensors *st = without(good, NULL);
    ag_err err;
    CHECK(ag_safetensors_set_meta(st, "optimizer.centered", "false", &err) == 0);
    EXPECT_REFUSED(AG_RMSPROP, written(st, "centered.safetensors"),
                   ": the file's rmsprop has centered false but the optimizer's has centered "
                   "true: one has a grad_avg buffer and the other has none");
    expect_bad_meta(AG_RMSPROP, good, "optimizer.centered", "1", "expected true or false");
    ag_safetensors_free(good);
}

// A copy of `st` without any tensor whose name starts with `prefix`.
static ag_safetensors *without_buffer(const ag_safetensors *st, const char *prefix) {
    ag_safetensors *out = without(st, NULL);
    for (int i = 0; i < ag_safetensors_count(st); i++) {
        if (strncmp(ag_safetensors_name(st, i), prefix, strlen(prefix)) != 0) continue;
        ag_safetensors *less = without(out, ag_safetensors_name(st, i));
        ag_safetensors_free(out);
        out = less;
    }
    return out;
}

// PyTorch's SGD makes its momentum buffer on the first step: a file may leave it
// out while momentum_initialised is false (it then loads as zeros and the next
// step starts it), never after, and never in part.
static void test_sgd_file_may_lack_its_momentum_buffer_only_before_the_first_step(void) {
    ag_safetensors *good = good_set(AG_SGD);  // step 3: initialised
    EXPECT_REFUSED(AG_SGD,
                   written(without_buffer(good, "optimizer.momentum_buffer."), "lack1.safetensors"),
                   ": optimizer state: missing 6 of 6 parameters: "
                   "'optimizer.momentum_buffer.l1.weight'");
    ag_safetensors *st = without(good, "optimizer.momentum_buffer.l1.bias");
    ag_err err;
    CHECK(ag_safetensors_set_meta(st, "optimizer.momentum_initialised", "false", &err) == 0);
    EXPECT_REFUSED(AG_SGD, written(st, "lack2.safetensors"),
                   ": optimizer state: missing 1 of 6 parameters: "
                   "'optimizer.momentum_buffer.l1.bias'");
    st = without_buffer(good, "optimizer.momentum_buffer.");
    CHECK(ag_safetensors_set_meta(st, "optimizer.momentum_initialised", "false", &err) == 0);
    const char *path = written(st, "lack3.safetensors");
    net *t = target_new(AG_SGD);
    CHECK(loads(t->ps, t->opt, path));
    CHECK(!ag_optim_momentum_initialised(t->opt) && ag_optim_step_count(t->opt) == 3);
    void *zeros = calloc(1, buffer_bytes(t->ps));
    CHECK(memcmp(ag_optim_state_data(t->opt, 0), zeros, buffer_bytes(t->ps)) == 0);
    free(zeros);
    net_free(t);
    // Adam's buffers start at zero: only a file at step 0 may leave them out.
    ag_safetensors_free(good);
    good = good_set(AG_ADAM);
    st = without_buffer(good, "optimizer.exp_avg_sq.");
    EXPECT_REFUSED(AG_ADAM, written(st, "lack4.safetensors"),
                   ": optimizer state: missing 6 of 6 parameters: 'optimizer.exp_avg_sq.l1.weight'");
    ag_safetensors_free(good);
}

// Only the learning rate evolves during training; the other hyperparameters
// belong to the code that makes the optimizer, and a load leaves them be.
static void test_hyperparameters_other_than_the_learning_rate_stay_the_optimizers(void) {
    ag_safetensors *good = good_set(AG_SGD);
    ag_safetensors *st = without(good, NULL);
    ag_err err;
    CHECK(ag_safetensors_set_meta(st, "optimizer.momentum", "0.5", &err) == 0);
    CHECK(ag_safetensors_set_meta(st, "optimizer.lr", "0.25", &err) == 0);
    const char *path = written(st, "momentum.safetensors");
    net *t = target_new(AG_SGD);
    CHECK(loads(t->ps, t->opt, path));
    CHECK(ag_optim_current_config(t->opt).momentum == 0.9);
    CHECK(ag_optim_lr(t->opt) == 0.25);
    net_free(t);
    ag_safetensors_free(good);
}

static void test_load_refuses_truncated_and_garbage_files(void) {
    ag_safetensors *good = good_set(AG_ADAM);
    const char *path = written(without(good, NULL), "whole.safetensors");
    size_t n;
    unsigned char *bytes = testing_read_file(path, &n);
    const char *cut = testing_path("cut.safetensors");
    testing_write_file(cut, bytes, n - 5);
    EXPECT_REFUSED(AG_ADAM, cut, "truncated file?");
    bytes[12] ^= 0x55;  // inside the JSON header
    const char *flipped = testing_path("flipped.safetensors");
    testing_write_file(flipped, bytes, n);
    EXPECT_REFUSED(AG_ADAM, flipped, "flipped.safetensors: ");
    EXPECT_REFUSED(AG_ADAM, testing_path("absent.safetensors"), ": cannot open");
    free(bytes);
    ag_safetensors_free(good);
}

static void test_optimizer_of_another_store_is_refused(void) {
    net *n = trained(AG_F32, AG_ADAM, 1);
    ag_optim *o = n->opt;
    net *m = net_new(AG_F32, 2);
    ag_err err;
    const char *path = testing_path("other.safetensors");
    CHECK(ag_checkpoint_save(m->ps, ag_optim_state(o), path, NULL, &err) != 0);
    CHECK(contains(err.msg, "checkpoint_save: the optimizer updates another parameter store"));
    CHECK(testing_count_files("other.safetensors") == 0);
    CHECK(saves(n->ps, o, path, NULL));
    CHECK(ag_checkpoint_load(m->ps, ag_optim_state(o), path, NULL, &err) != 0);
    CHECK(contains(err.msg, "checkpoint_load: the optimizer updates another parameter store"));
    ag_params_add(n->ps, "late", 1, (int[]){3});
    CHECK(ag_checkpoint_save(n->ps, ag_optim_state(o), path, NULL, &err) != 0);
    CHECK(contains(err.msg, "the parameter store grew from"));
    net_free(m);
    net_free(n);
}

// Pruning shrinks the store under the optimizer: the message says so and what to do.
static void test_optimizer_of_a_store_that_shrank_is_refused_asking_for_a_new_one(void) {
    net *n = trained(AG_F32, AG_ADAM, 1);
    size_t before = ag_params_buffer_len(n->ps);
    float kept[4 * HIDDEN] = {0};
    CHECK(ag_params_resize(n->ps, n->l2.weight, 2, (int[]){4, HIDDEN / 2}, kept));
    char want[200];
    snprintf(want, sizeof want,
             "checkpoint_save: the parameter store shrank from %zu to %zu elements after the "
             "optimizer was made (a parameter was resized, as pruning does); make a new "
             "optimizer for the store as it is now",
             before, ag_params_buffer_len(n->ps));
    ag_err err;
    CHECK(ag_checkpoint_save(n->ps, ag_optim_state(n->opt), testing_path("shrank.safetensors"),
                             NULL, &err) != 0);
    CHECK(contains(err.msg, want));
    CHECK(testing_count_files("shrank.safetensors") == 0);
    net_free(n);
}

// A parameter resized inside its alignment padding leaves the store's length as it was:
// the length check let the state be saved (each parameter's slice cut at its new shape
// from where the old one's state lay) and loaded, where the optimizer's own step refuses
// it. Both refuse it now, and write nothing.
static void test_optimizer_of_a_store_resized_at_the_same_length_is_refused(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_tensor *a = ag_params_add(ps, "a", 2, (int[]){4, 6});  // 24 elements, padded to 32
    ag_params_add(ps, "b", 1, (int[]){16});
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    ag_params_zero_grad(ps);
    ag_optim_step(o);
    const char *path = testing_path("same_length.safetensors");
    CHECK(saves(ps, o, path, NULL));
    const size_t len = ag_params_buffer_len(ps);
    CHECK(ag_params_resize(ps, a, 2, (int[]){5, 5}, (const float[25]){0}));
    CHECK(ag_params_buffer_len(ps) == len);
    const char *want = "a parameter was resized after the optimizer was made (as pruning "
                       "does), inside the store's 48 elements: the optimizer's state no longer "
                       "fits it; make a new optimizer for the store as it is now";
    ag_err err;
    const char *other = testing_path("same_length_2.safetensors");
    CHECK(ag_checkpoint_save(ps, ag_optim_state(o), other, NULL, &err) != 0);
    CHECK(contains(err.msg, "checkpoint_save: ") && contains(err.msg, want));
    CHECK(testing_count_files("same_length_2.safetensors") == 0);
    CHECK(ag_checkpoint_load(ps, ag_optim_state(o), path, NULL, &err) != 0);
    CHECK(contains(err.msg, "checkpoint_load: ") && contains(err.msg, want));
    ag_optim_free(o);
    o = ag_optim_new(ps, &c);  // what the message asks for
    CHECK(saves(ps, o, other, NULL));
    ag_optim_free(o);
    ag_params_free(ps);
}

static void test_parameter_named_like_optimizer_state_is_refused_with_an_optimizer(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_params_add(ps, "optimizer.exp_avg.w", 1, (int[]){2});
    ag_params_add(ps, "w", 1, (int[]){2});
    ag_optim_config c = ag_optim_defaults(AG_ADAM);
    ag_optim *o = ag_optim_new(ps, &c);
    ag_err err;
    CHECK(ag_checkpoint_save(ps, ag_optim_state(o), testing_path("clash.safetensors"), NULL, &err) != 0);
    CHECK(contains(err.msg, "parameter 'optimizer.exp_avg.w' is named like optimizer state"));
    CHECK(saves(ps, NULL, testing_path("clash.safetensors"), NULL));  // fine without one
    CHECK(loads(ps, NULL, testing_path("clash.safetensors")));
    ag_optim_free(o);
    ag_params_free(ps);
}

// ---- Saving --------------------------------------------------------------------------------

static void test_reserved_or_incomplete_metadata_is_refused_and_nothing_written(void) {
    net *n = trained(AG_F32, AG_ADAM, 1);
    ag_optim *o = n->opt;
    const char *path = testing_path("reserved.safetensors");
    ag_err err;
    CHECK(ag_checkpoint_save(n->ps, ag_optim_state(o), path, (const char *[]){"optimizer.step", "9", NULL}, &err) !=
          0);
    CHECK(contains(err.msg, "checkpoint_save: metadata key 'optimizer.step' is reserved"));
    CHECK(ag_checkpoint_save(n->ps, NULL, path, (const char *[]){"optimizer", "adam", NULL},
                             &err) != 0);
    CHECK(contains(err.msg, "metadata key 'optimizer' is reserved"));
    CHECK(ag_params_save(n->ps, path, (const char *[]){"optimizer.lr", "1", NULL}, &err) != 0);
    CHECK(contains(err.msg, "params_save: metadata key 'optimizer.lr' is reserved"));
    CHECK(ag_checkpoint_save(n->ps, ag_optim_state(o), path, (const char *[]){"epoch", NULL}, &err) != 0);
    CHECK(contains(err.msg, "metadata key 'epoch' has no value"));
    CHECK(saves(n->ps, o, path, (const char *[]){"optimizers", "fine", "my.optimizer.x", "fine",
                                                 NULL}));
    CHECK(testing_count_files("reserved.safetensors") == 1);
    net_free(n);
}

static void test_failed_save_keeps_the_previous_checkpoint(void) {
    net *n = trained(AG_F32, AG_ADAM, 2);
    ag_optim *o = n->opt;
    const char *path = testing_path("keep.safetensors");
    CHECK(saves(n->ps, o, path, NULL));
    size_t len;
    unsigned char *before = testing_read_file(path, &len);
    train_step(n, o, 2);

    testing_file_size limit = testing_file_size_limit(1024);
    ag_err err;
    int rc = ag_checkpoint_save(n->ps, ag_optim_state(o), path, NULL, &err);
    testing_file_size_restore(limit);

    CHECK(rc != 0);
    CHECK(strncmp(err.msg, path, strlen(path)) == 0 && contains(err.msg, "File too large"));
    size_t now_len;
    unsigned char *now = testing_read_file(path, &now_len);
    CHECK(now && now_len == len && memcmp(now, before, len) == 0);
    CHECK(testing_count_files(".tmp.") == 0);
    // And the previous checkpoint still loads: at step 2.
    net *t = target_new(AG_ADAM);
    CHECK(loads(t->ps, t->opt, path));
    CHECK(ag_optim_step_count(t->opt) == 2);
    net_free(t);
    free(before);
    free(now);
    net_free(n);
}

// SGD starts a parameter's momentum buffer on the first step that updates it (as
// PyTorch does on the first step it has a gradient): a checkpoint taken while one
// has been frozen on every step so far lists it ("momentum_not_started"), and the
// resumed run starts its buffer as the run that never stopped does.
static void test_sgd_parameter_frozen_so_far_resumes_with_its_buffer_unstarted(void) {
    double after[2][2];  // [resumed][w, b]
    for (int resumed = 0; resumed < 2; resumed++) {
        ag_params *ps = ag_params_new(AG_F64);
        ag_tensor *w = ag_params_add(ps, "w", 1, (const int[]){1});
        ag_tensor *b = ag_params_add(ps, "b", 1, (const int[]){1});
        ((double *)w->data)[0] = ((double *)b->data)[0] = 1;
        ag_optim_config c = ag_optim_defaults(AG_SGD);
        c.lr = 0.1;
        c.momentum = 0.9;
        c.dampening = 0.5;
        ag_optim *o = ag_optim_new(ps, &c);
        ag_tensor_set_requires_grad(w, false);
        ((double *)b->grad)[0] = 4;
        ag_optim_step(o);
        if (resumed) {
            const char *path = testing_path("frozen_so_far.safetensors");
            ag_err err;
            CHECK(ag_checkpoint_save(ps, ag_optim_state(o), path, NULL, &err) == 0);
            ag_safetensors *st = ag_safetensors_load(path, &err);
            const char *listed = st ? ag_safetensors_meta(st, "optimizer.momentum_not_started") : NULL;
            CHECK(listed && strcmp(listed, "[\"w\"]") == 0);
            ag_safetensors_free(st);
            ag_optim_free(o);
            o = ag_optim_new(ps, &c);
            CHECK(ag_checkpoint_load(ps, ag_optim_state(o), path, NULL, &err) == 0);
        }
        ag_tensor_set_requires_grad(w, true);
        ((double *)w->grad)[0] = 2;
        ((double *)b->grad)[0] = 3;
        ag_optim_step(o);
        after[resumed][0] = ((double *)w->data)[0];
        after[resumed][1] = ((double *)b->data)[0];
        ag_optim_free(o);
        ag_params_free(ps);
    }
    CHECK(after[0][0] == 1 - 0.1 * 2.0);  // buf = d = 2, undampened
    CHECK(memcmp(after[0], after[1], sizeof after[0]) == 0);
}

// An f64 checkpoint loads into an f32 model and optimizer, rounding each value.
static void test_f64_checkpoint_loads_into_an_f32_run(void) {
    net *n = trained(AG_F64, AG_ADAM, 3);
    ag_optim *o = n->opt;
    const char *path = testing_path("f64.safetensors");
    CHECK(saves(n->ps, o, path, NULL));
    net *t = target_new(AG_ADAM);
    CHECK(loads(t->ps, t->opt, path));
    for (int i = 0; i < ag_params_count(n->ps); i++) {
        const ag_tensor *a = ag_params_at(n->ps, i), *b = ag_params_at(t->ps, i);
        for (size_t j = 0; j < a->numel; j++)
            CHECK(ag_tensor_f32(b)[j] == (float)ag_tensor_f64(a)[j]);
    }
    // The stores pad differently (64 bytes is 16 floats but 8 doubles): the
    // state lands at each parameter's own offset.
    for (int i = 0; i < ag_params_count(n->ps); i++) {
        const ag_tensor *a = ag_params_at(n->ps, i), *b = ag_params_at(t->ps, i);
        const double *v64 = (const double *)ag_optim_state_data(o, 1) +
                            ((const double *)a->data - (const double *)ag_params_data(n->ps));
        const float *v32 = (const float *)ag_optim_state_data(t->opt, 1) +
                           ((const float *)b->data - (const float *)ag_params_data(t->ps));
        for (size_t j = 0; j < a->numel; j++) CHECK(v32[j] == (float)v64[j]);
    }
    CHECK(ag_optim_step_count(t->opt) == 3);
    net_free(t);
    net_free(n);
}

int main(void) {
    RUN(test_resumed_adam_run_matches_the_uninterrupted_run_bit_for_bit);
    RUN(test_resumed_adamw_run_matches_the_uninterrupted_run_bit_for_bit);
    RUN(test_resumed_sgd_momentum_run_matches_the_uninterrupted_run_bit_for_bit);
    RUN(test_resumed_lion_run_matches_the_uninterrupted_run_bit_for_bit);
    RUN(test_resumed_rmsprop_run_matches_the_uninterrupted_run_bit_for_bit);
    RUN(test_resumed_f64_runs_match_bit_for_bit);
    RUN(test_sgd_checkpoint_before_the_first_step_resumes_exactly);
    RUN(test_load_into_an_optimizer_that_has_taken_steps_replaces_all_it_holds);
    RUN(test_checkpoint_taken_at_the_last_step_resumes_to_the_same_end);
    RUN(test_file_is_a_state_dict_with_optimizer_state_beside_it);
    RUN(test_sgd_file_records_momentum_and_whether_it_started);
    RUN(test_rmsprop_file_records_its_settings_and_buffers);
    RUN(test_sgd_without_momentum_saves_no_state_tensors_and_resumes);
    RUN(test_user_metadata_round_trips);
    RUN(test_decay_groups_are_recorded_and_restored);
    RUN(test_decay_group_naming_no_parameter_is_refused);
    RUN(test_decay_group_of_every_parameter_round_trips);
    RUN(test_decay_group_that_is_no_list_of_names_is_refused);
    RUN(test_a_state_of_any_kind_round_trips_its_settings_and_buffers);
    RUN(test_a_setting_with_a_long_key_round_trips);
    RUN(test_a_state_that_always_writes_its_error_loads);
    RUN(test_model_only_checkpoint_is_what_params_save_writes);
    RUN(test_without_an_optimizer_only_the_parameters_load);
    RUN(test_load_refuses_missing_misshapen_or_stray_parameters);
    RUN(test_load_refuses_another_optimizer_naming_both);
    RUN(test_model_only_file_with_an_optimizer_is_refused);
    RUN(test_load_refuses_bad_step_learning_rate_or_flag);
    RUN(test_a_long_bad_value_is_cut_between_characters);
    RUN(test_load_refuses_missing_or_misshapen_state);
    RUN(test_load_refuses_stray_optimizer_tensors);
    RUN(test_load_refuses_sgd_momentum_mismatch);
    RUN(test_load_refuses_rmsprop_centered_mismatch);
    RUN(test_sgd_file_may_lack_its_momentum_buffer_only_before_the_first_step);
    RUN(test_hyperparameters_other_than_the_learning_rate_stay_the_optimizers);
    RUN(test_load_refuses_truncated_and_garbage_files);
    RUN(test_optimizer_of_another_store_is_refused);
    RUN(test_optimizer_of_a_store_that_shrank_is_refused_asking_for_a_new_one);
    RUN(test_optimizer_of_a_store_resized_at_the_same_length_is_refused);
    RUN(test_parameter_named_like_optimizer_state_is_refused_with_an_optimizer);
    RUN(test_reserved_or_incomplete_metadata_is_refused_and_nothing_written);
    RUN(test_failed_save_keeps_the_previous_checkpoint);
    RUN(test_f64_checkpoint_loads_into_an_f32_run);
    RUN(test_sgd_parameter_frozen_so_far_resumes_with_its_buffer_unstarted);
    testing_remove_tmpdir();
    return testing_summary();
}
