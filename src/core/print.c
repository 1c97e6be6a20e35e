// Printing tensors, for people: shape first, then a corner of the values.
#include "internal.h"

#define SHOW 6  // entries per row and rows per matrix before eliding

// Integer dtypes print exactly (an i64 may exceed a double's 53 bits).
static void print_value(const ag_tensor *t, size_t i, FILE *f) {
    switch (t->dtype) {
    case AG_I32: fprintf(f, "%ld", (long)((const int32_t *)t->data)[i]); break;
    case AG_I64: fprintf(f, "%lld", (long long)((const int64_t *)t->data)[i]); break;
    case AG_BOOL:
    case AG_U8: fprintf(f, "%u", (unsigned)((const uint8_t *)t->data)[i]); break;
    default: fprintf(f, "%9.4g", ag_tensor_item(t, i));
    }
}

static void print_row(const ag_tensor *t, size_t base, int n, FILE *f) {
    fputs("[", f);
    for (int j = 0; j < n; j++) {
        if (n > SHOW && j == SHOW / 2) {
            fputs(" ...", f);
            j = n - SHOW / 2 - 1;  // the loop's j++ lands on the last SHOW/2 entries
            continue;
        }
        if (j) fputs(" ", f);
        print_value(t, base + (size_t)j, f);
    }
    fputs("]", f);
}

// The values of t (its data pointer), a corner of each matrix.
static void print_values(const ag_tensor *t, FILE *f) {
    if (t->ndim == 0) {
        if (agi_is_float(t->dtype))
            fprintf(f, "%.6g", ag_tensor_item(t, 0));
        else
            print_value(t, 0, f);
        fputs("\n", f);
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

static void print_tensor(const ag_tensor *t, FILE *f) {
    if (!t) {
        fprintf(f, "(null tensor)\n");
        return;
    }
    if (t->name) {
        agi_fput_escaped(t->name, f);
        fputs(": ", f);
    }
    fprintf(f, "%s %s%s\n", ag_dtype_name(t->dtype), agi_shape(t),
            t->requires_grad ? " requires_grad" : "");
    if (t->data) print_values(t, f);
    else fputs("  (no data: a gradient no backward has reached)\n", f);
}

void ag_tensor_print(const ag_tensor *t, FILE *f) {
    if (agi_given(f, "tensor_print", "stream")) print_tensor(t, f);
}

void ag_tensor_print_grad(const ag_tensor *t, FILE *f) {
    if (!agi_given(f, "tensor_print_grad", "stream")) return;
    print_tensor(t, f);
    if (!t) return;
    if (!t->grad) {
        fputs("grad: none (no backward has reached it)\n", f);
        return;
    }
    fputs("grad:\n", f);
    ag_tensor view = ag_tensor_grad_view(t);
    print_values(&view, f);
}
