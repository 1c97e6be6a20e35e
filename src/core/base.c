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

const agi_dtype_info agi_dtypes[AGI_DTYPES] = {
    [AG_F32] = {"f32", sizeof(float)},    [AG_F64] = {"f64", sizeof(double)},
    [AG_BOOL] = {"bool", 1},              [AG_U8] = {"u8", sizeof(uint8_t)},
    [AG_I32] = {"i32", sizeof(int32_t)},  [AG_I64] = {"i64", sizeof(int64_t)},
};

const char *ag_dtype_name(ag_dtype dt) {
    return (unsigned)dt < AGI_DTYPES ? agi_dtypes[dt].name : "?";
}

size_t ag_dtype_size(ag_dtype dt) { return agi_dtype_size(dt); }

