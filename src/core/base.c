// dtype names and sizes, the version and the ABI check.
#include "internal.h"

#define AGI_STR(x) #x
#define AGI_VERSION_STR(a, b, c) AGI_STR(a) "." AGI_STR(b) "." AGI_STR(c)

const char *ag_version(void) {
    return AGI_VERSION_STR(AG_VERSION_MAJOR, AG_VERSION_MINOR, AG_VERSION_PATCH);
}

bool ag_abi_check(int major, int minor) {
    bool same = major == AG_VERSION_MAJOR &&
                (AG_VERSION_MAJOR == 0 ? minor == AG_VERSION_MINOR : minor <= AG_VERSION_MINOR);
    if (!same)
        ag_error("abi_check: built against the headers of attograd %d.%d, but this library is "
                 "%s, whose ABI differs: rebuild against its headers",
                 major, minor, ag_version());
    return same;
}

const char *ag_dtype_name(ag_dtype dt) {
    switch (dt) {
    case AG_F32: return "f32";
    case AG_F64: return "f64";
    case AG_BOOL: return "bool";
    case AG_U8: return "u8";
    case AG_I32: return "i32";
    case AG_I64: return "i64";
    }
    return "?";
}

size_t ag_dtype_size(ag_dtype dt) { return agi_dtype_size(dt); }

