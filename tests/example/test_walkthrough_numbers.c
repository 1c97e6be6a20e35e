// examples/backprop_walkthrough prints what it teaches: every number of its Part 1 (the
// notes' worked example, forward and backward to the projection weights) is recomputed
// here without attograd (walkthrough_reference.h) and must be the exact value rounded to
// the 4 digits printed; every gradient it prints, in both parts, is nonzero or is the key
// bias's, printed as exactly 0 where it is explained.
//
// Usage: test_walkthrough_numbers BACKPROP_WALKTHROUGH
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testing.h"
#include "walkthrough_reference.h"

static char *output;       // what the walkthrough printed
static const char *part2;  // where its Part 2 starts
static int status = -1;
static char dir[] = "/tmp/walkthrough_numbers_XXXXXX";

static bool exists(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

static void test_walkthrough_exits_zero_and_writes_its_graphs_and_pages(void) {
    CHECK(status == 0);
    CHECK(exists("w.dot") && exists("w.html"));
    CHECK(exists("w_notes.dot") && exists("w_notes.html"));
}

// Every entry of block `label` (n of them) is `want`, rounded as printed.
static bool block_agrees(const char *label, const double *want, int n) {
    double got[16];
    if (!wt_block(output, label, n, got, NULL)) return false;
    bool ok = true;
    for (int i = 0; i < n; i++)
        if (!wt_agrees(got[i], want[i])) {
            fprintf(stderr, "  %s, entry %d: printed %.10g, exactly %.10g\n", label, i, got[i],
                    want[i]);
            ok = false;
        }
    return ok;
}

static void test_scores_are_the_notes_S_1_exactly(void) {
    static const double notes_S[16] = {20.5, 15.2, 8.3,  12.1, 16.8, 22.3, 10.5, 14.2,
                                       9.2,  11.5, 19.8, 7.6,  13.4, 15.1, 9.9,  21.2};
    wt_reference w;
    CHECK(wt_recompute(output, &w));
    for (int i = 0; i < 16; i++) CHECK(fabs(w.S[i] - notes_S[i]) < 1e-12);
    CHECK(block_agrees("S = Q K^T", notes_S, 16));
}

static void test_forward_values_are_the_exact_ones_rounded(void) {
    wt_reference w;
    CHECK(wt_recompute(output, &w));
    CHECK(block_agrees("Q = X W_q^T + b_q", w.Q, 16));
    CHECK(block_agrees("K = X W_k^T + b_k", w.K, 16));
    CHECK(block_agrees("V = X W_v^T + b_v", w.V, 8));
    CHECK(block_agrees("S/8 = S / sqrt(64)", w.S8, 16));
    CHECK(block_agrees("A = softmax(S/8), row by row", w.A, 16));
    CHECK(block_agrees("O = A V", w.O, 8));
    const char *loss = strstr(output, "loss = sum of G * O = ");
    CHECK(loss && wt_agrees(strtod(loss + strlen("loss = sum of G * O = "), NULL), w.loss));
}

static void test_every_gradient_of_part_1_is_the_exact_one_rounded(void) {
    wt_reference w;
    CHECK(wt_recompute(output, &w));
    const double ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(block_agrees("d(G*O)", ones, 8));
    CHECK(block_agrees("dO = d(G*O) * G = G", w.dO, 8));
    CHECK(block_agrees("dA = dO V^T", w.dA, 16));
    CHECK(block_agrees("dV = A^T dO", w.dV, 8));
    CHECK(block_agrees("d(S/8) = A * (dA - rowsum(dA * A))", w.dS8, 16));
    CHECK(block_agrees("dS = d(S/8) / 8", w.dS, 16));
    CHECK(block_agrees("dQ = dS K", w.dQ, 16));
    CHECK(block_agrees("dK = dS^T Q", w.dK, 16));
    CHECK(block_agrees("dW_v = dV^T X", w.dWv, 8));
    CHECK(block_agrees("db_v = sum over the rows of dV", w.dbv, 2));
    CHECK(block_agrees("dW_k = dK^T X", w.dWk, 16));
    CHECK(block_agrees("db_k = sum over the rows of dK", w.dbk, 4));
    CHECK(block_agrees("dW_q = dQ^T X", w.dWq, 16));
    CHECK(block_agrees("db_q = sum over the rows of dQ", w.dbq, 4));
    CHECK(block_agrees("dX", w.dX, 16));
}

static void test_the_key_bias_gradient_is_printed_as_exactly_0_and_explained(void) {
    char words[4][32];
    wt_reference w;
    CHECK(wt_recompute(output, &w));
    CHECK(wt_block(output, "db_k = sum over the rows of dK", 4, NULL, words));
    for (int c = 0; c < 4; c++) {
        CHECK(strcmp(words[c], "0") == 0);
        CHECK(fabs(w.dbk[c]) < 1e-13);  // 0 in exact arithmetic: rounding only
    }
    const char *block = wt_find(output, "db_k = sum over the rows of dK");
    const char *why = block ? strstr(block, "d(b_k) is exactly 0") : NULL;
    CHECK(why && why < strstr(output, "#0 linear -> Q"));
    CHECK(why && strstr(why, "shift-invariant") != NULL);
}

// "      = (a)(b) + (c)(d) + ...": the four products written out for dK[1][2].
static void test_one_entry_of_dK_is_written_out_as_its_dot_product(void) {
    wt_reference w;
    CHECK(wt_recompute(output, &w));
    const char *line =
        strstr(output, "one entry by hand: dK[1][2] = column 1 of dS . column 2 of Q");
    CHECK(line != NULL);
    if (!line) return;
    const char *terms = strstr(line, "\n      = (");
    CHECK(terms != NULL);
    if (!terms) return;
    const char *p = terms + strlen("\n      = ");
    for (int i = 0; i < 4; i++) {
        double ds, q;
        int used = 0;
        CHECK(sscanf(p, "(%lf)(%lf)%n", &ds, &q, &used) == 2);
        CHECK(wt_agrees(ds, w.dS[4 * i + 1]) && wt_agrees(q, w.Q[4 * i + 2]));
        p += used;
        if (i < 3) p = strchr(p, '(');
        if (!p) return;
    }
    const char *tape = strstr(p, "(the tape: ");
    double total = 0, sum = tape ? strtod(tape + strlen("(the tape: "), NULL) : NAN;
    for (int i = 0; i < 4; i++) total += w.dS[4 * i + 1] * w.Q[4 * i + 2];
    CHECK(fabs(total - w.dK[4 * 1 + 2]) < 1e-12);
    CHECK(wt_agrees(sum, w.dK[4 * 1 + 2]));
}

static void test_row_0_of_the_softmax_backward_is_worked_by_hand(void) {
    wt_reference w;
    CHECK(wt_recompute(output, &w));
    const char *line = strstr(output, "by hand, row 0: sum(dA * A) = ");
    CHECK(line != NULL);
    if (!line) return;
    double dot = 0;
    for (int j = 0; j < 4; j++) dot += w.dA[j] * w.A[j];
    CHECK(wt_agrees(strtod(line + strlen("by hand, row 0: sum(dA * A) = "), NULL), dot));
    const char *values = strstr(line, "(dA[0][j] ");
    if (values) values = strstr(values, ") =");
    CHECK(values != NULL);
    if (!values) return;
    char *p = (char *)values + 3;
    for (int j = 0; j < 4; j++) CHECK(wt_agrees(strtod(p, &p), w.dS8[j]));
}

// The blocks of gradients Part 2 prints: "upstream d(...)", "sends d(...)" and "d loss /
// d x", each "[dims]" followed by its entries (matrices headed "[0,1,:,:]").
static void test_every_printed_gradient_is_nonzero_or_the_key_bias(void) {
    static const char *grad_labels[] = {"d(", "dO ", "dA ", "dV ", "dS ", "dQ ", "dK ", "dW_",
                                        "db_", "dX ", "upstream d(", "sends d(",
                                        "d loss / d x "};
    int blocks = 0, key_bias = 0, entries = 0;
    for (const char *line = output; line && *line; line = strchr(line, '\n')) {
        if (*line == '\n') line++;
        if (strncmp(line, "    ", 4) || line[4] == ' ') continue;
        const char *label = line + 4, *eol = strchr(label, '\n');
        bool grad = false;
        for (size_t k = 0; k < sizeof grad_labels / sizeof *grad_labels; k++)
            grad = grad || !strncmp(label, grad_labels[k], strlen(grad_labels[k]));
        const char *open = eol ? eol : label + strlen(label);
        while (open > label && *open != '[') open--;
        if (!grad || !eol || eol[-1] != ']' || *open != '[') continue;
        int n = 1, dim;
        for (const char *d = open + 1; sscanf(d, "%d", &dim) == 1; d = strchr(d, ',') + 1) {
            n *= dim;
            if (!strchr(d, ',') || strchr(d, ',') > eol) break;
        }
        char name[200];
        snprintf(name, sizeof name, "%.*s", (int)(eol - label), label);
        bool is_key_bias = strstr(name, "db_k") == name || strstr(name, "(bk = ") != NULL;
        blocks++;
        key_bias += is_key_bias && open < eol;
        const char *p = eol;
        for (int i = 0; i < n; i++) {
            while (*p == ' ' || *p == '\n' || *p == '[') {
                if (*p == '[') p = strchr(p, '\n');  // "[0,1,:,:]"
                else p++;
            }
            char *end;
            double v = strtod(p, &end);
            CHECK(end != p);
            if (end == p) break;
            entries++;
            bool zero = end - p == 1 && *p == '0';
            if (is_key_bias) CHECK(zero);
            else if (v == 0) {
                fprintf(stderr, "  a gradient printed as 0: %s\n", name);
                CHECK(v != 0);
            }
            p = end;
        }
    }
    CHECK(blocks >= 40);     // Part 1's 15 and Part 2's upstream and sends
    CHECK(key_bias == 2);    // one in each part
    CHECK(entries > 1000);
    CHECK(part2 != NULL);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_walkthrough_numbers BACKPROP_WALKTHROUGH\n");
        return 2;
    }
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' '%s/w.dot'", argv[1], dir);
    FILE *p = popen(cmd, "r");
    size_t cap = 1 << 20, len = 0;
    output = calloc(cap, 1);
    while (p && len + 1 < cap) {
        size_t got = fread(output + len, 1, cap - 1 - len, p);
        if (!got) break;
        len += got;
    }
    int rc = p ? pclose(p) : -1;
    status = rc >= 0 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    part2 = strstr(output, "==== Part 2");
    if (part2) {  // Part 1's labels are unique before Part 2
        char *cut = strdup(output);
        cut[part2 - output] = 0;
        RUN(test_scores_are_the_notes_S_1_exactly);
        char *whole = output;
        output = cut;
        RUN(test_forward_values_are_the_exact_ones_rounded);
        RUN(test_every_gradient_of_part_1_is_the_exact_one_rounded);
        RUN(test_the_key_bias_gradient_is_printed_as_exactly_0_and_explained);
        RUN(test_one_entry_of_dK_is_written_out_as_its_dot_product);
        RUN(test_row_0_of_the_softmax_backward_is_worked_by_hand);
        output = whole;
        free(cut);
    }
    RUN(test_walkthrough_exits_zero_and_writes_its_graphs_and_pages);
    RUN(test_every_printed_gradient_is_nonzero_or_the_key_bias);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    free(output);
    return testing_summary();
}
