// dtype names and sizes, and the version string.
#include "internal.h"

const char *ag_version(void) { return AG_VERSION_STRING; }

const char *ag_dtype_name(ag_dtype dt) {
    switch (dt) {
    case AG_F32: return "f32";
    case AG_F64: return "f64";
    case AG_BOOL: return "bool";
    }
    return "?";
}

size_t ag_dtype_size(ag_dtype dt) {
    switch (dt) {
    case AG_F32: return sizeof(float);
    case AG_F64: return sizeof(double);
    case AG_BOOL: return 1;
    }
    return 0;
}

bool agi_is_float(ag_dtype dt) { return dt == AG_F32 || dt == AG_F64; }
