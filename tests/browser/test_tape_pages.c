// The tape's web page (ag_tape_html) in a real browser: headless Chromium, driven over
// the DevTools protocol on a pipe (--remote-debugging-pipe: no port, no network, no
// other program). Two pages: the backprop walkthrough's worked example (its Part 1, the
// numbers recomputed without attograd: tests/example/walkthrough_reference.h), and a
// tiny_lm-shaped model's tape (embeddings, 4 pre-LN blocks, tied head, cross-entropy:
// 46 nodes), built here from the public API, with its layers collapsed and, as a second
// page, all 46 nodes shown. Each page loads with no console error and no request but its
// own file; stepping visits every node, forward then backward; the numbers shown for
// three nodes are the tape's, at the 4 digits printed; the 46-node page fits 1280 x 800
// without horizontal scrolling at every step.
//
// Usage: test_tape_pages CHROMIUM BACKPROP_WALKTHROUGH (registered only when CMake found
// Chromium). CDP_DEBUG=1 in the environment prints the protocol's messages.
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../src/core/json.h"
#include "example/walkthrough_reference.h"
#include "testing.h"
#include "testing_files.h"

// ---- The browser, over the protocol ------------------------------------------------------

typedef struct {
    pid_t pid;
    int to, from;  // we write commands to `to`; the browser writes to `from`
    char *buf;     // what was read and not yet split into messages
    size_t len, cap;
    int next_id;
    char session[128];
    char url[1200];     // the page open now
    char errors[2048];  // console errors, exceptions and foreign requests seen on it
} browser;

static browser chrome = {.pid = -1, .to = -1, .from = -1};
static char log_path[700], profile[600];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Moves fd to `target` in the child (fd may already be 3 or 4).
static void place_fd(int fd, int target) {
    if (fd != target && dup2(fd, target) < 0) _exit(127);
}

static bool chrome_start(const char *exe) {
    int to[2], from[2];
    if (pipe(to) || pipe(from)) return false;
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        // Out of the way of 3 and 4 first, then into them.
        int r = fcntl(to[0], F_DUPFD, 10), w = fcntl(from[1], F_DUPFD, 10);
        int log = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (r < 0 || w < 0 || log < 0) _exit(127);
        place_fd(log, 1), place_fd(log, 2);
        place_fd(r, 3), place_fd(w, 4);
        for (int fd = 5; fd < 64; fd++) close(fd);
        char user_dir[700];
        snprintf(user_dir, sizeof user_dir, "--user-data-dir=%s", profile);
        execl(exe, exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
              user_dir, "--no-first-run", "--no-default-browser-check", "--disable-extensions",
              "--disable-background-networking", "--disable-sync", "--mute-audio",
              "--hide-scrollbars", "--disable-dev-shm-usage",  // containers: a small /dev/shm
              "about:blank", (char *)NULL);
        _exit(127);
    }
    close(to[0]), close(from[1]);
    chrome.pid = pid, chrome.to = to[1], chrome.from = from[0];
    signal(SIGPIPE, SIG_IGN);  // a browser that died shows as a failed write, not a signal
    return true;
}

static void chrome_send(const char *msg) {
    size_t n = strlen(msg) + 1;  // with its NUL: the protocol's message separator
    for (size_t done = 0; done < n;) {
        ssize_t w = write(chrome.to, msg + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        done += (size_t)w;
    }
}

// The value at a dotted path ("params.request.url") of a JSON object: a string (malloc'd)
// into *s when s is not NULL, or a number into *x. False if there is none.
static bool json_at(const char *text, const char *path, char **s, double *x) {
    agi_json j;
    agi_json_init(&j, text, strlen(text));
    for (const char *seg = path;;) {
        size_t n = strcspn(seg, ".");
        if (!agi_json_object_begin(&j)) return false;
        bool found = false;
        char *key;
        while (agi_json_object_next(&j, &key)) {
            found = strlen(key) == n && !strncmp(key, seg, n);
            agi_free(key);
            if (found) break;
            if (!agi_json_skip(&j)) return false;
        }
        if (!found) return false;
        if (seg[n]) {
            seg += n + 1;
            continue;
        }
        if (s && agi_json_peek(&j) == AGI_JSON_STRING) {
            char *v;
            if (!agi_json_string(&j, &v)) return false;
            *s = strdup(v);
            agi_free(v);
            return true;
        }
        agi_json_number num;
        if (x && agi_json_peek(&j) == AGI_JSON_NUMBER && agi_json_number_read(&j, &num)) {
            char digits[64];
            snprintf(digits, sizeof digits, "%.*s", (int)num.len, num.text);
            *x = strtod(digits, NULL);
            return true;
        }
        return false;
    }
}

static void note_error(const char *what, const char *text) {
    size_t len = strlen(chrome.errors);
    snprintf(chrome.errors + len, sizeof chrome.errors - len, "%s%s: %.300s", len ? "; " : "",
             what, text ? text : "?");
}

// What every message may tell about the page: an error on its console, an exception, or
// a request for anything but the page itself.
static void observe(const char *msg) {
    char *method = NULL, *s = NULL;
    if (!json_at(msg, "method", &method, NULL)) return;
    if (!strcmp(method, "Runtime.consoleAPICalled")) {
        if (json_at(msg, "params.type", &s, NULL) && (!strcmp(s, "error") || !strcmp(s, "assert")))
            note_error("console error", msg);
    } else if (!strcmp(method, "Runtime.exceptionThrown")) {
        note_error("exception", msg);
    } else if (!strcmp(method, "Log.entryAdded")) {
        if (json_at(msg, "params.entry.level", &s, NULL) && !strcmp(s, "error"))
            note_error("logged error", msg);
    } else if (!strcmp(method, "Network.requestWillBeSent")) {
        if (json_at(msg, "params.request.url", &s, NULL) && strcmp(s, chrome.url) != 0)
            note_error("request", s);
    }
    free(method), free(s);
}

// The next message (malloc'd), or NULL when none comes before `deadline`.
static char *chrome_next(double deadline) {
    for (;;) {
        char *end = chrome.buf ? memchr(chrome.buf, 0, chrome.len) : NULL;
        if (end) {
            size_t n = (size_t)(end - chrome.buf) + 1;
            char *msg = strdup(chrome.buf);
            memmove(chrome.buf, chrome.buf + n, chrome.len - n);
            chrome.len -= n;
            observe(msg);
            if (getenv("CDP_DEBUG")) fprintf(stderr, "<< %.200s\n", msg);
            return msg;
        }
        double left = deadline - now();
        if (left <= 0) return NULL;
        struct pollfd p = {chrome.from, POLLIN, 0};
        int ready = poll(&p, 1, (int)(left * 1000) + 1);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) return NULL;
        if (chrome.len + 65536 > chrome.cap) {
            chrome.cap = 2 * chrome.cap + 65536;
            chrome.buf = realloc(chrome.buf, chrome.cap);
        }
        ssize_t got = read(chrome.from, chrome.buf + chrome.len, chrome.cap - chrome.len);
        if (got <= 0) return NULL;  // the browser is gone
        chrome.len += (size_t)got;
    }
}

// Sends a command (params: a JSON object, or NULL) to the page's session when `page`,
// else to the browser, and returns its reply (malloc'd), or NULL after `seconds`.
static char *chrome_call_within(const char *method, const char *params, bool page,
                                double seconds) {
    int id = ++chrome.next_id;
    size_t n = strlen(method) + (params ? strlen(params) : 2) + 256;
    char *msg = malloc(n);
    snprintf(msg, n, "{\"id\":%d,\"method\":\"%s\",\"params\":%s%s%s%s}", id, method,
             params ? params : "{}", page ? ",\"sessionId\":\"" : "", page ? chrome.session : "",
             page ? "\"" : "");
    if (getenv("CDP_DEBUG")) fprintf(stderr, ">> %.200s\n", msg);
    chrome_send(msg);
    free(msg);
    double deadline = now() + seconds;
    for (char *reply; (reply = chrome_next(deadline));) {
        double got;
        if (json_at(reply, "id", NULL, &got) && (int)got == id) return reply;
        free(reply);
    }
    fprintf(stderr, "  no reply to %s within %.0f s\n", method, seconds);
    return NULL;
}

// A command that does little: a browser that has not answered in 20 s is taken for hung.
static char *chrome_call(const char *method, const char *params, bool page) {
    return chrome_call_within(method, params, page, 20);
}

static bool chrome_do(const char *method, const char *params, bool page) {
    char *reply = chrome_call(method, params, page);
    bool ok = reply && !strstr(reply, "\"error\":{");
    if (reply && !ok) fprintf(stderr, "  %s: %.300s\n", method, reply);
    free(reply);
    return ok;
}

// A page of 1280 x 800 CSS pixels, with everything the checks listen to enabled.
static bool chrome_open_page(void) {
    char *reply = chrome_call("Target.createTarget", "{\"url\":\"about:blank\"}", false);
    char *target = NULL, *session = NULL;
    bool ok = reply && json_at(reply, "result.targetId", &target, NULL);
    free(reply);
    if (!ok) return false;
    char params[256];
    snprintf(params, sizeof params, "{\"targetId\":\"%s\",\"flatten\":true}", target);
    reply = chrome_call("Target.attachToTarget", params, false);
    ok = reply && json_at(reply, "result.sessionId", &session, NULL);
    if (ok) snprintf(chrome.session, sizeof chrome.session, "%s", session);
    free(reply), free(target), free(session);
    return ok && chrome_do("Runtime.enable", NULL, true) && chrome_do("Log.enable", NULL, true) &&
           chrome_do("Network.enable", NULL, true) && chrome_do("Page.enable", NULL, true) &&
           chrome_do("Emulation.setDeviceMetricsOverride",
                     "{\"width\":1280,\"height\":800,\"deviceScaleFactor\":1,\"mobile\":false}",
                     true);
}

// Navigates to `url` and waits for its load event.
static bool chrome_navigate(const char *url) {
    char params[1400];
    snprintf(params, sizeof params, "{\"url\":\"%s\"}", url);
    if (!chrome_do("Page.navigate", params, true)) return false;
    double deadline = now() + 20;
    for (char *msg; (msg = chrome_next(deadline));) {
        bool loaded = strstr(msg, "\"method\":\"Page.loadEventFired\"") != NULL;
        free(msg);
        if (loaded) return true;
    }
    fprintf(stderr, "  %s did not load\n", url);
    return false;
}

// Opens file `path` (+ fragment) afresh, and waits for its load event; forgets earlier
// errors. (From the same page, only the fragment would change, and nothing would load.)
static bool chrome_load(const char *path, const char *fragment) {
    if (!chrome_navigate("about:blank")) return false;
    snprintf(chrome.url, sizeof chrome.url, "file://%s", path);
    chrome.errors[0] = 0;
    char url[1300];
    snprintf(url, sizeof url, "%s%s", chrome.url, fragment);
    return chrome_navigate(url);
}

// Runs `js` (an expression) in the page and returns its value as a string (malloc'd), or
// NULL with the exception it threw, or NULL when it has not ended after `seconds`.
static char *chrome_eval_within(const char *js, double seconds) {
    char *quoted = malloc(agi_json_quote(js, NULL) + 1);
    quoted[agi_json_quote(js, quoted)] = 0;
    size_t n = strlen(quoted) + 64;
    char *params = malloc(n);
    snprintf(params, n, "{\"expression\":%s,\"returnByValue\":true}", quoted);
    char *reply = chrome_call_within("Runtime.evaluate", params, true, seconds);
    free(quoted), free(params);
    char *value = NULL;
    if (reply && !json_at(reply, "result.result.value", &value, NULL))
        fprintf(stderr, "  evaluating %.80s...: %.400s\n", js, reply);
    free(reply);
    return value;
}

static char *chrome_eval(const char *js) { return chrome_eval_within(js, 20); }

// A key pressed and released, as the keyboard does it.
static bool chrome_key(const char *key, const char *code, int key_code) {
    char params[256];
    const char *types[] = {"rawKeyDown", "keyUp"};
    for (int i = 0; i < 2; i++) {
        snprintf(params, sizeof params, "{\"type\":\"%s\",\"key\":\"%s\",\"code\":\"%s\","
                 "\"windowsVirtualKeyCode\":%d}", types[i], key, code, key_code);
        if (!chrome_do("Input.dispatchKeyEvent", params, true)) return false;
    }
    return true;
}

static void chrome_stop(void) {
    if (chrome.pid <= 0) return;
    chrome_send("{\"id\":999999,\"method\":\"Browser.close\",\"params\":{}}");
    close(chrome.to);
    for (int i = 0; i < 100; i++) {  // 5 s to close, then it is killed
        if (waitpid(chrome.pid, NULL, WNOHANG) == chrome.pid) {
            chrome.pid = -1;
            break;
        }
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    if (chrome.pid > 0) {
        kill(chrome.pid, SIGKILL);
        waitpid(chrome.pid, NULL, 0);
    }
    close(chrome.from);
    free(chrome.buf);
    chrome = (browser){.pid = -1, .to = -1, .from = -1};  // ready to start again
}

// ---- The pages ----------------------------------------------------------------------------

static char walkthrough_page[640], lm_page[640], lm_all_page[640];
static char *walkthrough_text;
static ag_tape *lm_tape;

// A tiny_lm-shaped model (examples/tiny_lm/model.c: embeddings with learned positions,
// pre-LN GELU blocks, a final LayerNorm, the head tied to the embedding), recorded on a
// tape with its backward and its check: 4 layers of 10 nodes, 46 nodes in all.
static ag_params *lm_params;
static ag_tensor *lm_build(ag_tape *tp) {
    enum { V = 256, E = 16, B = 2, T = 8, LAYERS = 4 };
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    lm_params = ag_params_new(AG_F32);
    ag_embedding_layer wte, wpe;
    ag_block blocks[LAYERS];
    ag_layernorm_layer ln_f;
    ag_block_config bc = {.d_model = E, .num_heads = 2, .dim_feedforward = 4 * E,
                          .activation = AG_ACT_GELU, .norm_first = true};
    bool ok = ag_embedding_layer_init(&wte, lm_params, "wte", V, E, &rng) &&
              ag_embedding_layer_init(&wpe, lm_params, "wpe", T, E, &rng) &&
              ag_layernorm_layer_init(&ln_f, lm_params, "ln_f", E);
    for (int l = 0; ok && l < LAYERS; l++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "blocks.%d", l);
        ok = ag_block_init(&blocks[l], lm_params, prefix, &bc, &rng);
    }
    if (!ok) return NULL;
    int32_t ids[B * T], targets[B * T];
    const char *text = "attention is all you need, said";  // bytes as tokens, as tiny_lm
    for (int i = 0; i < B * T; i++) ids[i] = (uint8_t)text[i], targets[i] = (uint8_t)text[i + 1];
    ag_tensor *x = ag_embedding_layer_forward(tp, &wte, ids, 2, (int[]){B, T});
    x = ag_add(tp, x, ag_slice(tp, wpe.weight, 0, 0, T));
    ag_block_opts o = {.causal = true};
    for (int l = 0; l < LAYERS; l++) x = ag_block_forward(tp, &blocks[l], x, &o);
    x = ag_layernorm_layer_forward(tp, &ln_f, x);
    ag_tensor *logits = ag_linear(tp, x, wte.weight, NULL);
    ag_tensor_set_name(logits, "logits");
    ag_tensor *loss = ag_cross_entropy(tp, logits, targets, B * T, -100);
    ag_tensor_set_name(loss, "loss");
    ag_backward(tp, loss);
    return loss;
}

// The numbers a panel shows for matrix `what` ("value", "grad", "send-0"), as
// "index=text" words; NULL if the page has no such matrix.
static char *shown(const char *what) {
    char js[600];
    snprintf(js, sizeof js,
             "(function () {"
             "  var m = document.querySelector('#panel [data-what=\"%s\"]');"
             "  if (!m) return 'none';"
             "  var out = [];"
             "  m.querySelectorAll('[data-i]').forEach(function (e) {"
             "    out.push(e.getAttribute('data-i') + '=' +"
             "             (e.getAttribute('data-v') || e.textContent));"
             "  });"
             "  return out.join(' ');"
             "})()", what);
    return chrome_eval(js);
}

// Every number of `words` ("i=v ...") is entry i of `exact` (n entries) rounded to 4
// digits, and there are `count` of them.
static bool numbers_agree(const char *what, const char *words, const double *exact, size_t n,
                          int count) {
    if (!words || !strcmp(words, "none")) {
        fprintf(stderr, "  no %s on the panel\n", what);
        return false;
    }
    int seen = 0;
    bool ok = true;
    for (const char *p = words; *p;) {
        char *end;
        long i = strtol(p, &end, 10);
        if (*end != '=' || i < 0 || (size_t)i >= n) return false;
        double v = strtod(end + 1, &end);
        if (!wt_agrees(v, exact[i])) {
            fprintf(stderr, "  %s entry %ld: shown %.10g, the tape %.10g\n", what, i, v, exact[i]);
            ok = false;
        }
        seen++;
        p = *end ? end + 1 : end;
    }
    if (seen != count) fprintf(stderr, "  %s: %d numbers shown, %d expected\n", what, seen, count);
    return ok && seen == count;
}

// Goes to a step the way a link does: by the address's fragment (the page follows it when
// its hashchange event comes, after the script that set it).
static bool go_to(const char *fragment) {
    char js[200];
    snprintf(js, sizeof js, "location.hash = '%s'", fragment);
    free(chrome_eval(js));
    char *at = NULL;
    for (int tries = 0; tries < 50; tries++) {
        free(at);
        at = chrome_eval("document.body.getAttribute('data-pass') + "
                         "document.body.getAttribute('data-node')");
        if (at && !strcmp(at, fragment + 1)) break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    bool ok = at && !strcmp(at, fragment + 1);
    if (!ok) fprintf(stderr, "  going to %s: at %s\n", fragment, at ? at : "?");
    free(at);
    return ok;
}

// The page's address ends in `fragment` within a second (it is written at most every
// 100 ms, and once after the last of quicker steps).
static bool address_says(const char *fragment) {
    char *at = NULL;
    for (int tries = 0; tries < 50; tries++) {
        free(at);
        at = chrome_eval("location.hash");
        if (at && !strcmp(at, fragment)) break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    bool ok = at && !strcmp(at, fragment);
    if (!ok) fprintf(stderr, "  the address ends in %s, not %s\n", at ? at : "?", fragment);
    free(at);
    return ok;
}

// Clicks "next" through every step from the first: each step shows one current box, the
// current node's, and in the end every node was current once forward, once backward. With
// `fits`, after each step nothing scrolls sideways: not the page, the graph or the panel.
// Eight steps to an evaluation, what they saw kept in the page (window.agSteps): all 92
// steps of the tiny_lm page in one took 15 to 19 s on a loaded 2-core machine, and 1 run
// in 3 there found no reply within the 20 s that tell a hung browser; eight take 2 s.
static const char *step_start =
    "(function () {"
    "  window.agSteps = {seen: {f: {}, b: {}}, count: {f: 0, b: 0}};"
    "  document.getElementById('first').click();"
    "  return '';"
    "})()";
static const char *step_on =  // steps s0 ... s1 - 1: '' when each is as it should be
    "(function (s0, s1, n, fits) {"
    "  var seen = window.agSteps.seen, count = window.agSteps.count;"
    "  for (var s = s0; s < s1; s++) {"
    "    var node = document.body.getAttribute('data-node');"
    "    var pass = document.body.getAttribute('data-pass');"
    "    var current = document.querySelectorAll('.box.current');"
    "    if (current.length !== 1) return 'step ' + s + ': ' + current.length + ' current boxes';"
    "    if (current[0].getAttribute('data-node') !== node)"
    "      return 'step ' + s + ': the current box is not node ' + node;"
    "    if (pass !== (s < n ? 'f' : 'b')) return 'step ' + s + ' is in pass ' + pass;"
    "    if (!seen[pass][node]) count[pass]++;"
    "    seen[pass][node] = true;"
    "    if (fits) {"
    "      var wide = [document.documentElement, document.getElementById('graph-pane'),"
    "                  document.getElementById('panel')].filter(function (e) {"
    "        return e.scrollWidth > e.clientWidth;"
    "      });"
    "      if (wide.length) return 'step ' + s + ': ' + (wide[0].id || 'the page') +"
    "                              ' scrolls sideways (' + wide[0].scrollWidth + ' > ' +"
    "                              wide[0].clientWidth + ')';"
    "    }"
    "    document.getElementById('next').click();"
    "  }"
    "  return '';"
    "})(%d, %d, %d, %s)";
static const char *step_end =
    "(function (n) {"
    "  var count = window.agSteps.count;"
    "  return count.f === n && count.b === n ? 'ok'"
    "       : 'visited ' + count.f + ' forward and ' + count.b + ' backward of ' + n;"
    "})(%d)";

static bool steps_visit_every_node(int n, bool fits) {
    char js[4096];
    char *r = chrome_eval(step_start);
    bool ok = r && !strcmp(r, "");
    for (int s = 0; ok && s < 2 * n; s += 8) {
        free(r);
        snprintf(js, sizeof js, step_on, s, s + 8 < 2 * n ? s + 8 : 2 * n, n,
                 fits ? "true" : "false");
        r = chrome_eval(js);
        ok = r && !strcmp(r, "");
    }
    if (ok) {
        free(r);
        snprintf(js, sizeof js, step_end, n);
        r = chrome_eval(js);
        ok = r && !strcmp(r, "ok");
    }
    if (!ok) fprintf(stderr, "  stepping: %s\n", r ? r : "?");
    free(r);
    return ok;
}

// ---- The walkthrough's page ------------------------------------------------------------------

static void test_the_walkthrough_page_loads_with_no_error_and_no_request(void) {
    CHECK(chrome_load(walkthrough_page, ""));
    char *title = chrome_eval("document.getElementById('title').textContent");
    CHECK(title && !strcmp(title, "attention backward: the notes' worked example"));
    free(title);
    if (chrome.errors[0]) fprintf(stderr, "  %s\n", chrome.errors);
    CHECK(chrome.errors[0] == 0);
}

static void test_stepping_the_walkthrough_visits_every_node_forward_then_backward(void) {
    CHECK(chrome_load(walkthrough_page, ""));
    CHECK(steps_visit_every_node(9, false));
    CHECK(chrome.errors[0] == 0);
}

// S = Q K^T (#3), K (#1, with what it sends to b_k: the 0 it is) and A (#5): values and
// gradients as the walkthrough's own numbers, recomputed without attograd.
static void test_the_walkthrough_page_shows_the_tapes_numbers(void) {
    wt_reference w;
    CHECK(wt_recompute(walkthrough_text, &w));
    CHECK(chrome_load(walkthrough_page, "#b3"));
    char *value = shown("value"), *grad = shown("grad"), *dq = shown("send-0");
    CHECK(numbers_agree("S", value, w.S, 16, 16));
    CHECK(numbers_agree("dS", grad, w.dS, 16, 16));
    CHECK(numbers_agree("dQ", dq, w.dQ, 16, 16));
    free(value), free(grad), free(dq);
    CHECK(go_to("#b1"));
    value = shown("value"), grad = shown("grad");
    char *dbk = shown("send-2");
    CHECK(numbers_agree("K", value, w.K, 16, 16));
    CHECK(numbers_agree("dK", grad, w.dK, 16, 16));
    CHECK(dbk && !strcmp(dbk, "0=0 1=0 2=0 3=0"));
    free(value), free(grad), free(dbk);
    CHECK(go_to("#f5"));
    value = shown("value"), grad = shown("grad");
    CHECK(numbers_agree("A", value, w.A, 16, 16));
    CHECK(numbers_agree("dA", grad, w.dA, 16, 16));
    free(value), free(grad);
    CHECK(chrome.errors[0] == 0);
}

static void test_the_fragment_opens_a_step_and_the_keyboard_steps(void) {
    CHECK(chrome_load(walkthrough_page, "#b3"));
    char *at = chrome_eval("document.body.getAttribute('data-pass') + "
                           "document.body.getAttribute('data-node')");
    CHECK(at && !strcmp(at, "b3"));  // the backward pass at #3
    free(at);
    CHECK(chrome_key("ArrowRight", "ArrowRight", 39));  // backward goes on to #2
    at = chrome_eval("location.hash + ' ' + document.querySelector('.box.current')"
                     ".getAttribute('data-node')");
    CHECK(at && !strcmp(at, "#b2 2"));
    free(at);
    CHECK(chrome_key("f", "KeyF", 70));  // the forward pass at the same node
    CHECK(chrome_key("ArrowLeft", "ArrowLeft", 37));
    CHECK(address_says("#f1"));  // steps 100 ms apart or less: the address follows at once
    CHECK(chrome.errors[0] == 0);
}

// ---- The tiny_lm tape's pages -----------------------------------------------------------------

static void test_the_tiny_lm_page_loads_with_no_error_and_no_request(void) {
    CHECK(chrome_load(lm_page, ""));
    char *title = chrome_eval("document.getElementById('summary').textContent");
    CHECK(title && strstr(title, "46 nodes") && strstr(title, "every node passed its check"));
    free(title);
    if (chrome.errors[0]) fprintf(stderr, "  %s\n", chrome.errors);
    CHECK(chrome.errors[0] == 0);
}

static void test_the_tiny_lm_page_shows_its_4_layers_collapsed_and_opens_one_on_click(void) {
    CHECK(chrome_load(lm_page, ""));
    char *r = chrome_eval(
        "(function () {"
        "  var groups = document.querySelectorAll('.box.group').length;"
        "  var boxes = document.querySelectorAll('.box').length;"
        "  document.querySelector('.box.group[data-group=\"1\"]')"
        "      .dispatchEvent(new MouseEvent('click', {bubbles: true}));"
        "  var open = [];"
        "  for (var i = 13; i <= 22; i++)"
        "    if (document.querySelector('.box[data-node=\"' + i + '\"]')) open.push(i);"
        "  return groups + ' ' + boxes + ' ' + document.querySelectorAll('.box.group').length +"
        "         ' ' + open.length;"
        "})()");
    // 6 nodes outside the layers + 4 layer boxes; the second layer opens into its 10 nodes.
    CHECK(r && !strcmp(r, "4 10 3 10"));
    if (r && strcmp(r, "4 10 3 10")) fprintf(stderr, "  groups, boxes, after: %s\n", r);
    free(r);
    CHECK(chrome.errors[0] == 0);
}

// Enter on a layer's box opens it and leaves the keyboard's focus on its first node's box;
// Enter on the open layer's label closes it, the focus on the layer's box again.
static void test_opening_a_layer_with_the_keyboard_keeps_the_focus_in_it(void) {
    CHECK(chrome_load(lm_page, ""));
    free(chrome_eval("document.querySelector('.box.group[data-group=\"1\"]').focus(), ''"));
    CHECK(chrome_key("Enter", "Enter", 13));
    const char *where = "(function () {"
                        "  var e = document.activeElement;"
                        "  return (e.getAttribute('data-node') || '-') + ' ' +"
                        "         (e.getAttribute('data-group') || '-');"
                        "})()";
    char *r = chrome_eval(where);
    CHECK(r && !strcmp(r, "13 -"));
    if (r && strcmp(r, "13 -")) fprintf(stderr, "  focus after opening: %s\n", r);
    free(r);
    free(chrome_eval("document.querySelector('.frame-label[data-group=\"1\"]').focus(), ''"));
    CHECK(chrome_key("Enter", "Enter", 13));
    r = chrome_eval(where);
    CHECK(r && !strcmp(r, "- 1"));
    if (r && strcmp(r, "- 1")) fprintf(stderr, "  focus after closing: %s\n", r);
    free(r);
    CHECK(chrome.errors[0] == 0);
}

static void test_stepping_the_tiny_lm_page_visits_every_node(void) {
    CHECK(chrome_load(lm_page, ""));
    CHECK(steps_visit_every_node(ag_tape_num_nodes(lm_tape), false));
    CHECK(chrome.errors[0] == 0);
}

static double *values_of(const ag_tensor *t, bool grad) {
    ag_tensor v = grad ? ag_tensor_grad_view(t) : *t;
    double *d = malloc(t->numel * sizeof *d);
    for (size_t i = 0; i < t->numel; i++) d[i] = ag_tensor_item(&v, i);
    return d;
}

// Node #0 (the embedding, [2,8,16]: a heatmap of 16 x 16), #44 (the logits [2,8,256]: 16
// rows, the first 64 of 256 columns) and #45 (the loss, and the gradient it sends to the
// logits): values, gradients and a send, against the tape's.
static void test_the_tiny_lm_page_shows_the_tapes_numbers(void) {
    const ag_node *emb = ag_tape_node(lm_tape, 0), *head = ag_tape_node(lm_tape, 44);
    const ag_node *ce = ag_tape_node(lm_tape, 45);
    CHECK(chrome_load(lm_page, "#f0"));
    double *v = values_of(emb->out, false), *g = values_of(emb->out, true);
    char *value = shown("value"), *grad = shown("grad");
    CHECK(numbers_agree("embedding", value, v, emb->out->numel, 256));
    CHECK(numbers_agree("d embedding", grad, g, emb->out->numel, 256));
    free(v), free(g), free(value), free(grad);
    CHECK(go_to("#b44"));
    v = values_of(head->out, false), g = values_of(head->out, true);
    value = shown("value"), grad = shown("grad");
    CHECK(numbers_agree("logits", value, v, head->out->numel, 16 * 64));
    CHECK(numbers_agree("d logits", grad, g, head->out->numel, 16 * 64));
    free(value), free(grad);
    CHECK(go_to("#b45"));
    double loss = ag_tensor_item(ce->out, 0);
    value = shown("value");
    char *sent = shown("send-0");  // the logits are read once: what is sent is their gradient
    CHECK(numbers_agree("loss", value, &loss, 1, 1));
    CHECK(numbers_agree("sent to the logits", sent, g, head->out->numel, 16 * 64));
    free(v), free(g), free(value), free(sent);
    CHECK(chrome.errors[0] == 0);
}

// All 46 nodes shown: at 1280 x 800 nothing scrolls sideways at any step, and the boxes
// neither overlap nor leave the graph's column, in letters of 12 px.
static void test_a_46_node_page_fits_1280_by_800_without_horizontal_scrolling(void) {
    CHECK(chrome_load(lm_all_page, ""));
    char *r = chrome_eval(
        "(function () {"
        "  var pane = document.getElementById('graph-pane').getBoundingClientRect();"
        "  var boxes = Array.prototype.map.call(document.querySelectorAll('.box rect.frame'),"
        "    function (e) { return e.getBoundingClientRect(); });"
        "  for (var i = 0; i < boxes.length; i++) {"
        "    var a = boxes[i];"
        "    if (a.left < pane.left || a.right > pane.right) return 'box ' + i + ' leaves the column';"
        "    for (var j = 0; j < i; j++) {"
        "      var b = boxes[j];"
        "      if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)"
        "        return 'boxes ' + j + ' and ' + i + ' overlap';"
        "    }"
        "  }"
        "  var size = parseFloat(getComputedStyle(document.querySelector('.box text')).fontSize);"
        "  return boxes.length + ' ' + window.innerWidth + 'x' + window.innerHeight + ' ' + size;"
        "})()");
    CHECK(r && !strcmp(r, "46 1280x800 12"));
    if (r && strcmp(r, "46 1280x800 12")) fprintf(stderr, "  %s\n", r);
    free(r);
    CHECK(steps_visit_every_node(46, true));
    CHECK(chrome.errors[0] == 0);
}

// Keys held or pressed quickly: 500 steps at once (on and back 250 times), then 3 on. The
// address still names the step the page shows (a browser ignores a page that rewrites
// its address more than 200 times in 10 s).
static void test_quick_steps_leave_the_address_at_the_step_shown(void) {
    CHECK(chrome_load(walkthrough_page, ""));
    // One task, so that no step waits for the page's timer: 14 s on a loaded 2-core
    // machine (0.03 s a click), within a hair of the 20 s of a call that does little.
    char *done = chrome_eval_within("(function () {"
                                    "  for (var i = 0; i < 250; i++) {"
                                    "    document.getElementById('next').click();"
                                    "    document.getElementById('prev').click();"
                                    "  }"
                                    "  for (var j = 0; j < 3; j++)"
                                    "    document.getElementById('next').click();"
                                    "  return '';"
                                    "})()",
                                    60);
    CHECK(done && !strcmp(done, ""));
    free(done);
    char *at = chrome_eval("document.body.getAttribute('data-pass') + "
                           "document.body.getAttribute('data-node')");
    CHECK(at && !strcmp(at, "f3"));
    free(at);
    CHECK(address_says("#f3"));
    CHECK(chrome.errors[0] == 0);
}

// ---- Names of any length ----------------------------------------------------------------------

// A tensor named with 10 KB and an op with 2 KB, no spaces (and the title too): the names
// wrap on the panel, the step label is cut short, and the controls stay on screen.
static char long_page[640];
static char long_name[10241], long_op[2049];
static void long_copy(ag_node *n) { ag_tensor_copy(n->out, n->in[0]); }

static bool write_long_page(void) {
    static ag_op op = {long_op, long_copy, NULL, long_name};
    memset(long_name, 'W', sizeof long_name - 1);
    memset(long_op, 'o', sizeof long_op - 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 2, (int[]){2, 2}, (double[]){1, 2, 3, 4});
    ag_tensor_set_requires_grad(x, true);
    ag_tensor_set_name(x, long_name);
    ag_tensor *y = ag_op_apply(tp, &op, 1, &x, 2, (int[]){2, 2}, NULL, 0);
    ag_tensor_set_name(y, long_name);
    ag_sum(tp, y);
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.title = long_name;
    ag_err err;
    snprintf(long_page, sizeof long_page, "%s", testing_path("long.html"));
    bool ok = ag_tape_html(tp, long_page, &o, &err) == 0;
    ag_tape_free(tp);
    ag_tensor_free(x);
    return ok;
}

static void test_long_names_wrap_and_the_controls_stay_on_screen(void) {
    CHECK(chrome_load(long_page, "#b0"));
    for (int pass = 0; pass < 2; pass++) {
        char *r = chrome_eval(
            "(function () {"
            "  var wide = [document.documentElement, document.getElementById('bar'),"
            "              document.getElementById('panel')].filter(function (e) {"
            "    return e.scrollWidth > e.clientWidth;"
            "  });"
            "  if (wide.length) return (wide[0].id || 'the page') + ' is ' + wide[0].scrollWidth +"
            "                          ' wide in ' + wide[0].clientWidth;"
            "  var off = ['first', 'prev', 'next', 'last', 'forward', 'backward'].filter("
            "    function (id) {"
            "      var b = document.getElementById(id).getBoundingClientRect();"
            "      return b.right > window.innerWidth || b.bottom > window.innerHeight;"
            "    });"
            "  return off.length ? off.join(' ') + ' off screen' : 'ok';"
            "})()");
        CHECK(r && !strcmp(r, "ok"));
        if (r && strcmp(r, "ok")) fprintf(stderr, "  %s\n", r);
        free(r);
        if (!pass) CHECK(go_to("#f0"));
    }
    CHECK(chrome.errors[0] == 0);
}

// ---- A check that compared nothing -----------------------------------------------------------

// The sum of a tensor of infinities: its check perturbs nothing, so it has no error to
// show; the page must not say "largest error 0" as if it had compared and found none.
static char inf_page[640];

// Its second node, w * w, reads a leaf with a note twice: the note is shown once.
static bool write_inf_page(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){2}, (double[]){INFINITY, -INFINITY});
    ag_tensor *w = ag_tensor_from(AG_F64, 1, (int[]){2}, (double[]){3, -1});
    ag_tensor_set_requires_grad(x, true);
    ag_tensor_set_requires_grad(w, true);
    ag_tensor *sum_x = ag_sum(tp, x);  // #0, then #1 w * w: in this order
    ag_tensor *ww = ag_mul(tp, w, w);
    ag_tensor *total = ag_add(tp, sum_x, ag_sum(tp, ww));
    // #4 reads a map of 100 entries, among them a NaN and -inf.
    double v[100];
    for (int i = 0; i < 100; i++) v[i] = i == 7 ? NAN : i == 8 ? -INFINITY : i;
    ag_tensor *m = ag_tensor_from(AG_F64, 2, (int[]){10, 10}, v);
    ag_tensor_set_requires_grad(m, true);
    ag_tensor *sum_m = ag_sum(tp, m);
    ag_backward(tp, ag_add(tp, total, sum_m));
    ag_tape_check_report r;
    ag_tape_check(tp, NULL, &r);
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.check = &r;
    ag_tape_html_note note = {w, "read twice"};
    o.notes = &note;
    o.n_notes = 1;
    ag_err err;
    snprintf(inf_page, sizeof inf_page, "%s", testing_path("inf.html"));
    bool ok = r.nodes[0].fd.comparisons == 0 && ag_tape_html(tp, inf_page, &o, &err) == 0;
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(w), ag_tensor_free(m);
    return ok;
}

static void test_a_check_that_compared_nothing_shows_no_error_of_0(void) {
    CHECK(chrome_load(inf_page, "#b0"));
    char *r = chrome_eval("(function () {"
                          "  var s = document.querySelectorAll('#panel section');"
                          "  return s[s.length - 1].textContent;"
                          "})()");
    CHECK(r && strstr(r, "? inconclusive: nothing compared, in float64; 1 forward run;"));
    CHECK(r && !strstr(r, "largest error"));
    if (r && strstr(r, "largest error")) fprintf(stderr, "  %s\n", r);
    free(r);
    CHECK(chrome.errors[0] == 0);
}

// The map says what its purple and dark blue cells are; no legend for colours it lacks.
static void test_a_heatmap_says_which_colours_are_nan_and_infinity(void) {
    CHECK(go_to("#f4"));
    char *r = chrome_eval("(function () {"
                          "  var m = document.querySelector('#panel [data-what=\"leaf-value\"]');"
                          "  var l = m && m.querySelector('.legend');"
                          "  return l ? l.textContent : 'none';"
                          "})()");
    CHECK(r && !strcmp(r, "in the map: NaN purple, \xe2\x88\x92infinity dark blue"));
    if (r && !strstr(r, "NaN purple")) fprintf(stderr, "  legend: %s\n", r);
    free(r);
    CHECK(chrome.errors[0] == 0);
}

static void test_a_leaf_read_twice_by_one_node_is_shown_so(void) {
    CHECK(go_to("#f1"));
    char *r = chrome_eval("document.querySelectorAll('#panel .note').length + ' ' +"
                          "document.querySelector('#panel .note').textContent");
    CHECK(r && !strcmp(r, "1 input 0 of #1: read twice"));
    if (r && strcmp(r, "1 input 0 of #1: read twice")) fprintf(stderr, "  notes: %s\n", r);
    free(r);
    // What w's gradient is: the sum of the node's two reads, not of "2 nodes".
    r = chrome_eval("document.querySelector('#panel [data-what=\"total\"]').parentNode"
                    ".querySelector('summary').textContent");
    CHECK(r && !strcmp(r, "input 0 of #1 is read 2 times by this node; its gradient is the sum "
                          "of what each read is sent"));
    if (r && !strstr(r, "by this node")) fprintf(stderr, "  %s\n", r);
    free(r);
    CHECK(chrome.errors[0] == 0);
}

// ---- Two failed nodes of an op with no name ----------------------------------------------

// A copy whose backward sends twice the gradient: its check fails, as a wrong rule should.
static void copy_forward(ag_node *n) {
    memcpy(ag_tensor_f64(n->out), ag_tensor_f64(n->in[0]), n->out->numel * sizeof(double));
}
static void copy_twice_backward(ag_node *n) {
    const double *dy = n->out->grad;
    double *dx = n->in[0]->grad;
    for (size_t i = 0; i < n->out->numel; i++) dx[i] += 2 * dy[i];
}
static const ag_op unnamed_copy = {"", copy_forward, copy_twice_backward, NULL};

static char failed_page[640];

static bool write_failed_page(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){1, -2, 0.5});
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *y = ag_op_apply(tp, &unnamed_copy, 1, &x, 1, (int[]){3}, NULL, 0);
    ag_tensor *z = ag_op_apply(tp, &unnamed_copy, 1, &y, 1, (int[]){3}, NULL, 0);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, z, z)));
    ag_tape_check_report r;
    ag_tape_check(tp, NULL, &r);
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.check = &r;
    ag_err err;
    snprintf(failed_page, sizeof failed_page, "%s", testing_path("failed.html"));
    bool ok = r.n_failed == 2 && ag_tape_html(tp, failed_page, &o, &err) == 0;
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    ag_tensor_free(x);
    return ok;
}

// The summary counts in words that agree with the count (it read "2 failed its check"), and
// an op with an empty name reads as one ("The rule of :").
static void test_two_failed_nodes_of_an_unnamed_op_read_as_such(void) {
    CHECK(chrome_load(failed_page, "#b0"));
    char *r = chrome_eval("document.getElementById('summary').textContent");
    CHECK(r && strstr(r, "2 nodes failed their check"));
    if (r && !strstr(r, "2 nodes failed their check")) fprintf(stderr, "  summary: %s\n", r);
    free(r);
    r = chrome_eval("document.getElementById('panel').textContent");
    CHECK(r && strstr(r, "The rule of its op:") && !strstr(r, "The rule of :"));
    free(r);
    CHECK(chrome.errors[0] == 0);
}

// ---- Setting up --------------------------------------------------------------------------

static bool run_walkthrough(const char *exe) {
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "'%s' '%s' > '%s'", exe, testing_path("w.dot"),
             testing_path("w.txt"));
    if (system(cmd) != 0) {
        fprintf(stderr, "test_tape_pages: %s failed\n", exe);
        return false;
    }
    size_t n;
    walkthrough_text = (char *)testing_read_file(testing_path("w.txt"), &n);
    char *part2 = walkthrough_text ? strstr(walkthrough_text, "==== Part 2") : NULL;
    if (part2) *part2 = 0;  // Part 1's labels are unique before it
    snprintf(walkthrough_page, sizeof walkthrough_page, "%s", testing_path("w_notes.html"));
    return part2 != NULL;
}

static bool write_lm_pages(void) {
    lm_tape = ag_tape_new();
    if (!lm_build(lm_tape) || ag_tape_num_nodes(lm_tape) != 46) return false;
    ag_tape_check_report r;
    bool ok = ag_tape_check(lm_tape, NULL, &r);
    ag_tape_html_opts o = ag_tape_html_defaults();
    o.title = "tiny_lm, 4 layers";
    o.check = &r;
    ag_err err;
    snprintf(lm_page, sizeof lm_page, "%s", testing_path("lm.html"));
    snprintf(lm_all_page, sizeof lm_all_page, "%s", testing_path("lm_all.html"));
    ok = ok && ag_tape_html(lm_tape, lm_page, &o, &err) == 0;
    o.max_nodes = 46;
    ok = ok && ag_tape_html(lm_tape, lm_all_page, &o, &err) == 0;
    ag_tape_check_report_free(&r);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_tape_pages CHROMIUM BACKPROP_WALKTHROUGH\n");
        return 2;
    }
    double start = now();
    snprintf(log_path, sizeof log_path, "%s", testing_path("chromium.log"));
    snprintf(profile, sizeof profile, "%s", testing_path("profile"));
    if (!run_walkthrough(argv[2]) || !write_lm_pages() || !write_long_page() ||
        !write_inf_page() || !write_failed_page()) {
        fprintf(stderr, "test_tape_pages: could not write the pages\n");
        return 1;
    }
    bool driven = chrome_start(argv[1]) && chrome_open_page();
    if (!driven) {
        // The first launch on a fresh machine once took more than 20 s to answer (a cold
        // start that the same build's next three launches did not repeat): started once
        // more, with a profile of its own, before the run is failed.
        fprintf(stderr, "test_tape_pages: %s did not answer; starting it once more\n", argv[1]);
        chrome_stop();
        snprintf(profile, sizeof profile, "%s", testing_path("profile2"));
        driven = chrome_start(argv[1]) && chrome_open_page();
    }
    if (!driven) {
        fprintf(stderr, "test_tape_pages: could not drive %s (its output: %s)\n", argv[1],
                log_path);
        chrome_stop();
        return 1;
    }
    RUN(test_the_walkthrough_page_loads_with_no_error_and_no_request);
    RUN(test_stepping_the_walkthrough_visits_every_node_forward_then_backward);
    RUN(test_the_walkthrough_page_shows_the_tapes_numbers);
    RUN(test_the_fragment_opens_a_step_and_the_keyboard_steps);
    RUN(test_the_tiny_lm_page_loads_with_no_error_and_no_request);
    RUN(test_the_tiny_lm_page_shows_its_4_layers_collapsed_and_opens_one_on_click);
    RUN(test_opening_a_layer_with_the_keyboard_keeps_the_focus_in_it);
    RUN(test_stepping_the_tiny_lm_page_visits_every_node);
    RUN(test_the_tiny_lm_page_shows_the_tapes_numbers);
    RUN(test_a_46_node_page_fits_1280_by_800_without_horizontal_scrolling);
    RUN(test_quick_steps_leave_the_address_at_the_step_shown);
    RUN(test_long_names_wrap_and_the_controls_stay_on_screen);
    RUN(test_a_check_that_compared_nothing_shows_no_error_of_0);
    RUN(test_a_leaf_read_twice_by_one_node_is_shown_so);
    RUN(test_a_heatmap_says_which_colours_are_nan_and_infinity);
    RUN(test_two_failed_nodes_of_an_unnamed_op_read_as_such);
    chrome_stop();
    fprintf(stderr, "%.1f s\n", now() - start);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", profile);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", profile);
    ag_tape_free(lm_tape);
    ag_params_free(lm_params);
    free(walkthrough_text);
    if (!testing_failures) testing_remove_tmpdir();
    return testing_summary();
}
