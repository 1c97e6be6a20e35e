// JSON: a strict pull reader and a string writer, for file headers (io) and for
// settings kept as JSON text (an optimizer's decay groups, optim_state.c). It knows
// no file format: it sits in core so that every floor above can read and write it.
//
// The reader walks the text as the caller expects it to be shaped, so a
// header is checked against its schema while it is read, and nothing is
// allocated but the strings handed to the caller. Memory stays bounded by the
// nesting depth (at most AGI_JSON_MAX_DEPTH) however hostile the input:
//
//     agi_json j;
//     agi_json_init(&j, text, len);
//     char *key;
//     if (agi_json_object_begin(&j))
//         while (agi_json_object_next(&j, &key)) {
//             ... read exactly one value (agi_json_string, agi_json_skip, ...)
//             agi_free(key);
//         }
//     if (j.failed) puts(j.error);  // e.g. "expected ':' but found '}' at byte 12"
//
// Strict RFC 8259: no comments, no trailing commas, no leading zeros, no
// single quotes; strings must be valid UTF-8 (no overlong forms, no
// surrogates) with escaped control characters; \uXXXX escapes must pair
// surrogates correctly. Strings come out NUL-terminated, so \u0000 is
// rejected. The first error sticks: every later call returns false.
#ifndef ATTOGRAD_CORE_JSON_H
#define ATTOGRAD_CORE_JSON_H

#include "internal.h"

#define AGI_JSON_MAX_DEPTH 64

typedef enum agi_json_kind {
    AGI_JSON_NONE,  // end of input, a character no value starts with, or a failed reader
    AGI_JSON_NULL,
    AGI_JSON_BOOL,
    AGI_JSON_NUMBER,
    AGI_JSON_STRING,
    AGI_JSON_ARRAY,
    AGI_JSON_OBJECT,
} agi_json_kind;

typedef struct agi_json {
    const char *text;
    size_t len, pos;
    int depth;
    bool first[AGI_JSON_MAX_DEPTH];  // no member read yet in the open object/array
    bool failed;
    char error[160];
} agi_json;

// A number as written: `text` points into the input. `integer`: written
// without fraction or exponent; `fits`: an integer within int64_t, which is
// then `value`.
typedef struct agi_json_number {
    const char *text;
    size_t len;
    bool integer, fits;
    int64_t value;
} agi_json_number;

void agi_json_init(agi_json *j, const char *text, size_t len);

// The kind of the next value, from its first character; consumes nothing.
agi_json_kind agi_json_peek(agi_json *j);
// "an object", "a string", ... for messages.
const char *agi_json_kind_name(agi_json_kind k);

// Objects: begin consumes '{'; each call to next reads a key and its ':'
// into *key (agi_malloc'd, or not kept when key is NULL) and returns true,
// or consumes the closing '}' and returns false. Then read the value.
bool agi_json_object_begin(agi_json *j);
bool agi_json_object_next(agi_json *j, char **key);
// Arrays: next returns true when an element follows (read it), false after ']'.
bool agi_json_array_begin(agi_json *j);
bool agi_json_array_next(agi_json *j);

bool agi_json_string(agi_json *j, char **out);  // agi_malloc'd, NUL-terminated UTF-8
bool agi_json_number_read(agi_json *j, agi_json_number *out);
bool agi_json_skip(agi_json *j);  // any value, fully checked
// Succeeds when only whitespace is left.
bool agi_json_finish(agi_json *j);

// Writes `s` as a quoted JSON string into `dst` (when non-NULL) and returns
// its length; escapes as serde_json and Python's json do (", \, \b \f \n \r
// \t, other control characters as \u00xx) and passes UTF-8 through.
size_t agi_json_quote(const char *s, char *dst);

// True when s[0..n) is valid UTF-8 without NUL bytes.
bool agi_utf8_valid(const char *s, size_t n);

#endif
