// JSON: a strict pull reader (file headers, settings kept as text) and quoting
// strings for the writer. JSON text is UTF-8, so the UTF-8 checks live here too.
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

// ---- UTF-8 --------------------------------------------------------------------

// Length of the valid UTF-8 sequence starting at s (n bytes available), or 0:
// rejects stray continuation bytes, overlong forms, surrogates and code
// points beyond U+10FFFF.
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

bool agi_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = u[i] ? utf8_seq(u + i, n - i) : 0;
        if (!k) return false;
        i += k;
    }
    return true;
}

// Encodes a code point (valid, not a surrogate) into dst when non-NULL.
static size_t put_utf8(char *dst, uint32_t cp) {
    unsigned char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp, n = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | cp >> 6), b[1] = (unsigned char)(0x80 | (cp & 0x3F)), n = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | cp >> 12);
        b[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | cp >> 18);
        b[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    if (dst) memcpy(dst, b, n);
    return n;
}

// ---- Reader state -----------------------------------------------------------------

void agi_json_init(agi_json *j, const char *text, size_t len) {
    memset(j, 0, sizeof *j);
    j->text = text;
    j->len = len;
}

static int at(const agi_json *j) {
    return j->pos < j->len ? (unsigned char)j->text[j->pos] : -1;
}

static void skip_ws(agi_json *j) {
    while (j->pos < j->len) {
        char c = j->text[j->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        j->pos++;
    }
}

// What the reader is looking at, for messages: 'x', byte 0x01, the end.
static const char *found(const agi_json *j, char buf[24]) {
    int c = at(j);
    if (c < 0) return "the end of the text";
    if (c >= 0x20 && c < 0x7F)
        snprintf(buf, 24, "'%c'", c);
    else
        snprintf(buf, 24, "byte 0x%02x", (unsigned)c);
    return buf;
}

// Records the first error with the byte position; always returns false.
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static bool fail(agi_json *j, const char *fmt, ...) {
    if (j->failed) return false;
    char what[120];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(j->error, sizeof j->error, "%s at byte %zu", what, j->pos);
    j->failed = true;
    return false;
}

static bool expected(agi_json *j, const char *what) {
    char buf[24];
    return fail(j, "expected %s but found %s", what, found(j, buf));
}

agi_json_kind agi_json_peek(agi_json *j) {
    if (j->failed) return AGI_JSON_NONE;
    skip_ws(j);
    int c = at(j);
    switch (c) {
    case '{': return AGI_JSON_OBJECT;
    case '[': return AGI_JSON_ARRAY;
    case '"': return AGI_JSON_STRING;
    case 't':
    case 'f': return AGI_JSON_BOOL;
    case 'n': return AGI_JSON_NULL;
    default: return c == '-' || (c >= '0' && c <= '9') ? AGI_JSON_NUMBER : AGI_JSON_NONE;
    }
}

const char *agi_json_kind_name(agi_json_kind k) {
    switch (k) {
    case AGI_JSON_NONE: break;
    case AGI_JSON_NULL: return "null";
    case AGI_JSON_BOOL: return "a boolean";
    case AGI_JSON_NUMBER: return "a number";
    case AGI_JSON_STRING: return "a string";
    case AGI_JSON_ARRAY: return "an array";
    case AGI_JSON_OBJECT: return "an object";
    }
    return "no value";
}

// ---- Strings ------------------------------------------------------------------------

static bool hex4(agi_json *j, size_t p, uint32_t *out) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; i++) {
        int c = p + i < j->len ? (unsigned char)j->text[p + i] : -1;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail(j, "invalid \\u escape (it needs four hex digits)");
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return true;
}

// One escape sequence at j->pos (the backslash); appends its bytes.
static bool read_escape(agi_json *j, char *dst, size_t *n) {
    const char *t = j->text;
    int e = j->pos + 1 < j->len ? (unsigned char)t[j->pos + 1] : -1;
    char simple = 0;
    switch (e) {
    case '"': simple = '"'; break;
    case '\\': simple = '\\'; break;
    case '/': simple = '/'; break;
    case 'b': simple = '\b'; break;
    case 'f': simple = '\f'; break;
    case 'n': simple = '\n'; break;
    case 'r': simple = '\r'; break;
    case 't': simple = '\t'; break;
    case 'u': break;
    case -1: return fail(j, "unterminated string");
    default:
        if (e >= 0x20 && e < 0x7F) return fail(j, "invalid escape '\\%c'", e);
        return fail(j, "invalid escape: backslash before byte 0x%02x", (unsigned)e);
    }
    if (simple) {
        if (dst) dst[*n] = simple;
        *n += 1;
        j->pos += 2;
        return true;
    }
    uint32_t cp = 0, lo = 0;
    if (!hex4(j, j->pos + 2, &cp)) return false;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return fail(j, "\\u%04X is a low surrogate without a high surrogate before it",
                    (unsigned)cp);
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        size_t p = j->pos + 6;
        if (!(p + 1 < j->len && t[p] == '\\' && t[p + 1] == 'u'))
            return fail(j, "\\u%04X is a high surrogate without a low surrogate after it",
                        (unsigned)cp);
        if (!hex4(j, p + 2, &lo)) return false;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return fail(j, "\\u%04X is a high surrogate without a low surrogate after it",
                        (unsigned)cp);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        j->pos += 6;
    }
    if (cp == 0) return fail(j, "\\u0000 in a string (NUL characters are not supported)");
    *n += put_utf8(dst ? dst + *n : NULL, cp);
    j->pos += 6;
    return true;
}

// The string at j->pos (its opening quote): checks it, and decodes it into
// dst when non-NULL (the decoded form is never longer than the text).
static bool read_string(agi_json *j, char *dst, size_t *len) {
    const unsigned char *t = (const unsigned char *)j->text;
    size_t n = 0;
    j->pos++;
    for (;;) {
        if (j->pos >= j->len) return fail(j, "unterminated string");
        unsigned c = t[j->pos];
        if (c == '"') {
            j->pos++;
            *len = n;
            return true;
        }
        if (c < 0x20) return fail(j, "unescaped control character 0x%02x in a string", c);
        if (c == '\\') {
            if (!read_escape(j, dst, &n)) return false;
            continue;
        }
        size_t k = utf8_seq(t + j->pos, j->len - j->pos);
        if (!k) return fail(j, "invalid UTF-8 in a string");
        if (dst) memcpy(dst + n, t + j->pos, k);
        n += k;
        j->pos += k;
    }
}

bool agi_json_string(agi_json *j, char **out) {
    if (out) *out = NULL;
    if (j->failed) return false;
    skip_ws(j);
    if (at(j) != '"') return expected(j, "a string");
    size_t start = j->pos, n;
    if (!read_string(j, NULL, &n)) return false;
    if (out) {
        char *s = agi_malloc(n + 1);
        j->pos = start;
        read_string(j, s, &n);
        s[n] = 0;
        *out = s;
    }
    return true;
}

// ---- Numbers and literals -----------------------------------------------------------

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

bool agi_json_number_read(agi_json *j, agi_json_number *out) {
    memset(out, 0, sizeof *out);
    if (j->failed) return false;
    skip_ws(j);
    size_t start = j->pos;
    bool neg = at(j) == '-';
    if (neg) j->pos++;
    if (!is_digit(at(j))) return expected(j, neg ? "a digit after '-'" : "a number");
    if (at(j) == '0') {
        j->pos++;
        if (is_digit(at(j))) return fail(j, "leading zero in a number");
    }
    while (is_digit(at(j))) j->pos++;
    size_t int_end = j->pos;
    bool is_int = true;
    if (at(j) == '.') {
        j->pos++;
        if (!is_digit(at(j))) return expected(j, "a digit after '.'");
        while (is_digit(at(j))) j->pos++;
        is_int = false;
    }
    if (at(j) == 'e' || at(j) == 'E') {
        j->pos++;
        if (at(j) == '+' || at(j) == '-') j->pos++;
        if (!is_digit(at(j))) return expected(j, "a digit in the exponent");
        while (is_digit(at(j))) j->pos++;
        is_int = false;
    }
    out->text = j->text + start;
    out->len = j->pos - start;
    out->integer = is_int;
    if (!is_int) return true;
    // Accumulate the magnitude in 64 unsigned bits; -2^63 fits, +2^63 does not.
    uint64_t mag = 0;
    for (size_t p = start + neg; p < int_end; p++) {
        unsigned d = (unsigned)(j->text[p] - '0');
        if (mag > (UINT64_MAX - d) / 10) return true;
        mag = mag * 10 + d;
    }
    if (mag > (uint64_t)INT64_MAX + neg) return true;
    out->value = !neg ? (int64_t)mag : mag > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)mag;
    out->fits = true;
    return true;
}

static bool literal(agi_json *j, const char *word) {
    size_t n = strlen(word);
    if (j->len - j->pos < n || memcmp(j->text + j->pos, word, n) != 0)
        return expected(j, "a value");
    j->pos += n;
    return true;
}

// ---- Containers ---------------------------------------------------------------------

static bool open_container(agi_json *j, char open, const char *what) {
    if (j->failed) return false;
    skip_ws(j);
    if (at(j) != open) return expected(j, what);
    if (j->depth == AGI_JSON_MAX_DEPTH)
        return fail(j, "nesting deeper than %d levels", AGI_JSON_MAX_DEPTH);
    j->pos++;
    j->first[j->depth++] = true;
    return true;
}

// Before a member: consumes the closing character (returns false) or, after
// the first member, the ',' separating members.
static bool next_member(agi_json *j, char close) {
    if (j->failed) return false;
    if (j->depth == 0) return fail(j, "no open object or array");
    skip_ws(j);
    if (at(j) == close) {
        j->pos++;
        j->depth--;
        return false;
    }
    if (!j->first[j->depth - 1]) {
        if (at(j) != ',') return expected(j, close == '}' ? "',' or '}'" : "',' or ']'");
        j->pos++;
    }
    j->first[j->depth - 1] = false;
    return true;
}

bool agi_json_object_begin(agi_json *j) { return open_container(j, '{', "an object"); }
bool agi_json_array_begin(agi_json *j) { return open_container(j, '[', "an array"); }
bool agi_json_array_next(agi_json *j) { return next_member(j, ']'); }

bool agi_json_object_next(agi_json *j, char **key) {
    if (key) *key = NULL;
    bool first = j->depth > 0 && j->first[j->depth - 1];
    if (!next_member(j, '}')) return false;
    skip_ws(j);
    if (at(j) != '"') return expected(j, first ? "a string key or '}'" : "a string key");
    if (!agi_json_string(j, key)) return false;
    skip_ws(j);
    if (at(j) != ':') {
        if (key) {
            agi_free(*key);
            *key = NULL;
        }
        return expected(j, "':'");
    }
    j->pos++;
    return true;
}

bool agi_json_skip(agi_json *j) {
    agi_json_number num;
    switch (agi_json_peek(j)) {
    case AGI_JSON_OBJECT:
        if (!agi_json_object_begin(j)) return false;
        while (agi_json_object_next(j, NULL))
            if (!agi_json_skip(j)) return false;
        return !j->failed;
    case AGI_JSON_ARRAY:
        if (!agi_json_array_begin(j)) return false;
        while (agi_json_array_next(j))
            if (!agi_json_skip(j)) return false;
        return !j->failed;
    case AGI_JSON_STRING: return agi_json_string(j, NULL);
    case AGI_JSON_NUMBER: return agi_json_number_read(j, &num);
    case AGI_JSON_BOOL: return literal(j, at(j) == 't' ? "true" : "false");
    case AGI_JSON_NULL: return literal(j, "null");
    case AGI_JSON_NONE: break;
    }
    return expected(j, "a value");
}

bool agi_json_finish(agi_json *j) {
    if (j->failed) return false;
    skip_ws(j);
    if (j->pos < j->len) {
        char buf[24];
        return fail(j, "unexpected %s after the end of the JSON value", found(j, buf));
    }
    return true;
}

// ---- Writing --------------------------------------------------------------------------

static void put(char *dst, size_t *n, const void *src, size_t len) {
    if (dst) memcpy(dst + *n, src, len);
    *n += len;
}

size_t agi_json_quote(const char *s, char *dst) {
    size_t n = 0;
    put(dst, &n, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8] = {'\\', 0, 0};
        switch (*p) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            if (*p < 0x20) snprintf(esc, sizeof esc, "\\u%04x", (unsigned)*p);
        }
        if (esc[1])
            put(dst, &n, esc, strlen(esc));
        else
            put(dst, &n, p, 1);
    }
    put(dst, &n, "\"", 1);
    return n;
}
