// Printing tensors, for people: shape first, then a corner of the values.
#include "internal.h"

#define SHOW 6  // entries per row and rows per matrix before eliding

static void print_row(const ag_tensor *t, size_t base, int n, FILE *f) {
    fputs("[", f);
    for (int j = 0; j < n; j++) {
        if (n > SHOW && j == SHOW / 2) {
            fputs(" ...", f);
            j = n - SHOW / 2 - 1;  // the loop's j++ lands on the last SHOW/2 entries
            continue;
        }
        fprintf(f, j ? " %9.4g" : "%9.4g", ag_tensor_get(t, base + (size_t)j));
    }
    fputs("]", f);
}

void ag_tensor_print(const ag_tensor *t, FILE *f) {
    if (!t) {
        fprintf(f, "(null tensor)\n");
        return;
    }
    fprintf(f, "%s%s%s %s%s\n", t->name ? t->name : "", t->name ? ": " : "",
            ag_dtype_name(t->dtype), agi_shape(t), t->requires_grad ? " requires_grad" : "");
    if (t->ndim == 0) {
        fprintf(f, "%.6g\n", ag_tensor_get(t, 0));
        return;
    }
    int cols = t->shape[t->ndim - 1];
    size_t rows = t->numel / (size_t)cols;
    int rows_per_matrix = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    for (size_t r = 0; r < rows; r++) {
        size_t in_matrix = r % (size_t)rows_per_matrix;
        if (rows_per_matrix > SHOW && in_matrix == SHOW / 2) {
            fputs("  ...\n", f);
            r += (size_t)rows_per_matrix - SHOW - 1;  // r++ lands on the last SHOW/2 rows
            continue;
        }
        if (in_matrix == 0 && t->ndim > 2) {
            size_t m = r / (size_t)rows_per_matrix;
            fprintf(f, "  (matrix %zu)\n", m);
        }
        fputs("  ", f);
        print_row(t, r * (size_t)cols, cols, f);
        fputs("\n", f);
    }
}
