// Part 1 of examples/backprop_walkthrough.c, recomputed without attograd: its printed
// inputs read back from its text, then the forward and backward of one attention head in
// plain loops (Q = X W_q^T, K, V likewise, biases 0; S = Q K^T; A = softmax(S / 8) by
// rows; O = A V; loss = sum(G * O)), every gradient written out from its definition.
// Shared by the test of the walkthrough's text and the test of its web page.
#ifndef ATTOGRAD_TESTS_WALKTHROUGH_REFERENCE_H
#define ATTOGRAD_TESTS_WALKTHROUGH_REFERENCE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Where a printed block starts: the line "    <label> [<shape>]" (labels are unique in
// Part 1), then its entries, row after row. NULL if there is no such line.
static const char *wt_find(const char *text, const char *label) {
    char key[256];
    snprintf(key, sizeof key, "\n    %s [", label);
    const char *at = strstr(text, key);
    return at ? strchr(at + 1, '\n') : NULL;
}

// The n entries of the block `label` into out (as printed: out may be NULL); their text
// into words (each up to 31 characters) when not NULL. False if the block is missing or
// short.
static bool wt_block(const char *text, const char *label, int n, double *out,
                     char (*words)[32]) {
    const char *p = wt_find(text, label);
    if (!p) {
        fprintf(stderr, "  no block \"%s\" in the walkthrough's output\n", label);
        return false;
    }
    for (int i = 0; i < n; i++) {
        while (*p == ' ' || *p == '\n') p++;
        char *end;
        double v = strtod(p, &end);
        if (end == p) {
            fprintf(stderr, "  block \"%s\": entry %d is not a number\n", label, i);
            return false;
        }
        if (out) out[i] = v;
        if (words) snprintf(words[i], 32, "%.*s", (int)(end - p), p);
        p = end;
    }
    return true;
}

// A printed number agrees with the exact value when it is that value rounded to 4
// significant digits: within half a unit of its 4th digit.
static bool wt_agrees(double printed, double exact) {
    if (printed == 0) return fabs(exact) < 1e-12;
    double unit = pow(10, floor(log10(fabs(printed))) - 3);
    return fabs(printed - exact) <= 0.5 * unit * (1 + 1e-9) + 1e-15;
}

typedef struct {
    double X[16], Wq[16], Wk[16], Wv[8], G[8];                       // read back
    double Q[16], K[16], V[8], S[16], S8[16], A[16], O[8], loss;   // forward
    double dO[8], dA[16], dV[8], dS8[16], dS[16], dQ[16], dK[16];  // backward
    double dWq[16], dWk[16], dWv[8], dbq[4], dbk[4], dbv[2], dX[16];
} wt_reference;

// y[r][c] = sum_k a(r, k) b(k, c), each operand read through its strides: a(r, k) is
// a[r * ar + k * ak], b(k, c) is b[k * bk + c * bc].
static void wt_product(const double *a, int ar, int ak, const double *b, int bk, int bc,
                       int rows, int cols, int inner, double *y) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            double s = 0;
            for (int k = 0; k < inner; k++) s += a[r * ar + k * ak] * b[k * bk + c * bc];
            y[r * cols + c] = s;
        }
}

// a b^T: rows of a against rows of b (x W^T, Q K^T).
static void wt_abt(const double *a, const double *b, int rows, int cols, int inner,
                   double *y) {
    wt_product(a, inner, 1, b, 1, inner, rows, cols, inner, y);
}

// a^T b: columns of a against columns of b (A^T dO, dY^T X).
static void wt_atb(const double *a, const double *b, int rows, int cols, int inner,
                   double *y) {
    wt_product(a, 1, rows, b, cols, 1, rows, cols, inner, y);
}

// a b.
static void wt_ab(const double *a, const double *b, int rows, int cols, int inner, double *y) {
    wt_product(a, inner, 1, b, cols, 1, rows, cols, inner, y);
}

// Reads the inputs Part 1 prints and recomputes everything from them.
static bool wt_recompute(const char *text, wt_reference *w) {
    if (!wt_block(text, "X (4 tokens, one a row)", 16, w->X, NULL) ||
        !wt_block(text, "W_q", 16, w->Wq, NULL) || !wt_block(text, "W_k", 16, w->Wk, NULL) ||
        !wt_block(text, "W_v", 8, w->Wv, NULL) ||
        !wt_block(text, "G (the loss's weights)", 8, w->G, NULL))
        return false;
    wt_abt(w->X, w->Wq, 4, 4, 4, w->Q);
    wt_abt(w->X, w->Wk, 4, 4, 4, w->K);
    wt_abt(w->X, w->Wv, 4, 2, 4, w->V);
    wt_abt(w->Q, w->K, 4, 4, 4, w->S);
    for (int i = 0; i < 16; i++) w->S8[i] = w->S[i] / 8;
    for (int r = 0; r < 4; r++) {
        double m = w->S8[4 * r], z = 0;
        for (int j = 1; j < 4; j++) m = fmax(m, w->S8[4 * r + j]);
        for (int j = 0; j < 4; j++) z += exp(w->S8[4 * r + j] - m);
        for (int j = 0; j < 4; j++) w->A[4 * r + j] = exp(w->S8[4 * r + j] - m) / z;
    }
    wt_ab(w->A, w->V, 4, 2, 4, w->O);
    w->loss = 0;
    for (int i = 0; i < 8; i++) w->loss += w->G[i] * w->O[i];
    // Backward, each from its definition.
    memcpy(w->dO, w->G, sizeof w->dO);                          // d sum(G * O) / dO = G
    wt_abt(w->dO, w->V, 4, 4, 2, w->dA);                        // dA = dO V^T
    wt_atb(w->A, w->dO, 4, 2, 4, w->dV);                        // dV = A^T dO
    for (int r = 0; r < 4; r++) {                               // softmax's Jacobian
        for (int j = 0; j < 4; j++) {
            double s = 0;  // sum_k dA[r][k] (d A[r][k] / d S8[r][j])
            for (int k = 0; k < 4; k++)
                s += w->dA[4 * r + k] * w->A[4 * r + k] * ((k == j) - w->A[4 * r + j]);
            w->dS8[4 * r + j] = s;
        }
    }
    for (int i = 0; i < 16; i++) w->dS[i] = w->dS8[i] / 8;
    wt_ab(w->dS, w->K, 4, 4, 4, w->dQ);                         // dQ = dS K
    wt_atb(w->dS, w->Q, 4, 4, 4, w->dK);                        // dK = dS^T Q
    wt_atb(w->dQ, w->X, 4, 4, 4, w->dWq);                       // dW = dY^T X
    wt_atb(w->dK, w->X, 4, 4, 4, w->dWk);
    wt_atb(w->dV, w->X, 2, 4, 4, w->dWv);
    for (int c = 0; c < 4; c++) {                               // db = column sums of dY
        w->dbq[c] = w->dbk[c] = 0;
        for (int r = 0; r < 4; r++) w->dbq[c] += w->dQ[4 * r + c], w->dbk[c] += w->dK[4 * r + c];
    }
    for (int c = 0; c < 2; c++) {
        w->dbv[c] = 0;
        for (int r = 0; r < 4; r++) w->dbv[c] += w->dV[2 * r + c];
    }
    double a[16], b[16], c[16];                                 // dX = dQ W_q + dK W_k + dV W_v
    wt_ab(w->dQ, w->Wq, 4, 4, 4, a);
    wt_ab(w->dK, w->Wk, 4, 4, 4, b);
    wt_ab(w->dV, w->Wv, 4, 4, 2, c);
    for (int i = 0; i < 16; i++) w->dX[i] = a[i] + b[i] + c[i];
    return true;
}

#endif
