// The strict JSON reader behind file headers (src/core/json.c): what it
// accepts, what it rejects and with which message, and that hostile input
// can neither crash it nor make it allocate without bound.
#include "../src/core/json.h"

#include "testing.h"

static agi_json reader;

// Reads one whole value; true if the text is one valid JSON document.
static bool parses(const char *s) {
    agi_json_init(&reader, s, strlen(s));
    return agi_json_skip(&reader) && agi_json_finish(&reader);
}

// The error for an invalid document ("" if it parsed).
static const char *error_of(const char *s) { return parses(s) ? "" : reader.error; }

// True if the text is rejected with a message containing `part`.
static bool fails_with(const char *text, const char *part) {
    const char *e = error_of(text);
    if (strstr(e, part)) return true;
    fprintf(stderr, "  %s -> \"%s\", wanted \"%s\"\n", text, e, part);
    return false;
}

static void test_accepts_valid_documents(void) {
    CHECK(parses("{}"));
    CHECK(parses("[]"));
    CHECK(parses(" \t\r\n{ \"a\" : [ 1 , -2 , 3.5e-3 , true , false , null , \"x\" ] } \n "));
    CHECK(parses("{\"a\":{\"b\":{\"c\":[[],[{}]]}}}"));
    CHECK(parses("\"just a string\""));
    CHECK(parses("0"));
    CHECK(parses("-0"));
    CHECK(parses("1E+2"));
    CHECK(parses("{\"\":\"\"}"));
    CHECK(parses("{\"a\":1,\"a\":2}"));  // duplicates are the schema's business
}

static void test_rejects_structural_errors_with_position(void) {
    CHECK(fails_with("", "expected a value but found the end of the text at byte 0"));
    CHECK(fails_with("{", "expected a string key or '}' but found the end of the text"));
    CHECK(fails_with("{\"a\":1", "expected ',' or '}' but found the end of the text"));
    CHECK(fails_with("{\"a\" 1}", "expected ':' but found '1' at byte 5"));
    CHECK(fails_with("{\"a\":1,}", "expected a string key but found '}' at byte 7"));
    CHECK(fails_with("{a:1}", "expected a string key or '}' but found 'a' at byte 1"));
    CHECK(fails_with("[1,]", "expected a value but found ']' at byte 3"));
    CHECK(fails_with("[1 2]", "expected ',' or ']' but found '2'"));
    CHECK(fails_with("[1}", "expected ',' or ']' but found '}'"));
    CHECK(fails_with("{\"a\":1]", "expected ',' or '}' but found ']'"));
    CHECK(fails_with("{} {}", "unexpected '{' after the end of the JSON value at byte 3"));
    CHECK(fails_with("{'a':1}", "expected a string key or '}' but found '''"));
    CHECK(fails_with("[1] // comment", "unexpected '/'"));
    CHECK(fails_with("[\x01]", "found byte 0x01"));
}

static void test_rejects_bad_literals_and_numbers(void) {
    CHECK(fails_with("tru", "expected a value"));
    CHECK(fails_with("nul", "expected a value"));
    CHECK(fails_with("True", "expected a value but found 'T'"));
    CHECK(fails_with("01", "leading zero in a number"));
    CHECK(fails_with("-", "expected a digit after '-'"));
    CHECK(fails_with("1.", "expected a digit after '.'"));
    CHECK(fails_with(".5", "expected a value but found '.'"));
    CHECK(fails_with("+1", "expected a value but found '+'"));
    CHECK(fails_with("1e", "expected a digit in the exponent"));
    CHECK(fails_with("NaN", "expected a value"));
    CHECK(fails_with("Infinity", "expected a value"));
}

static agi_json_number number(const char *s) {
    agi_json_number n;
    agi_json_init(&reader, s, strlen(s));
    CHECK(agi_json_number_read(&reader, &n));
    CHECK(agi_json_finish(&reader));
    return n;
}

static void test_integers_are_exact_and_overflow_is_flagged(void) {
    agi_json_number n = number("9223372036854775807");
    CHECK(n.integer && n.fits && n.value == INT64_MAX);
    n = number("-9223372036854775808");
    CHECK(n.integer && n.fits && n.value == INT64_MIN);
    n = number("9223372036854775808");
    CHECK(n.integer && !n.fits);
    n = number("-9223372036854775809");
    CHECK(n.integer && !n.fits);
    n = number("184467440737095516160");
    CHECK(n.integer && !n.fits);
    n = number("-0");
    CHECK(n.integer && n.fits && n.value == 0);
    n = number("12.0");
    CHECK(!n.integer && !n.fits && n.len == 4 && memcmp(n.text, "12.0", 4) == 0);
    n = number("1e3");
    CHECK(!n.integer);
}

static char *string_of(const char *s) {
    char *out = NULL;
    agi_json_init(&reader, s, strlen(s));
    if (!agi_json_string(&reader, &out) || !agi_json_finish(&reader)) {
        agi_free(out);
        return NULL;
    }
    return out;
}

static void test_strings_decode_escapes_and_utf8(void) {
    char *s = string_of("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"");
    CHECK(s && strcmp(s, "a\"b\\c/d\b\f\n\r\t") == 0);
    agi_free(s);
    s = string_of("\"\\u00e9\\u20AC\\ud83d\\ude00 caf\xc3\xa9 \xf0\x9f\x98\x80\"");
    CHECK(s && strcmp(s, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 caf\xc3\xa9 \xf0\x9f\x98\x80") == 0);
    agi_free(s);
    s = string_of("\"\"");
    CHECK(s && s[0] == 0);
    agi_free(s);
}

static void test_strings_reject_bad_escapes_and_surrogates(void) {
    CHECK(fails_with("\"abc", "unterminated string"));
    CHECK(fails_with("\"abc\\", "unterminated string"));
    CHECK(fails_with("\"\\x41\"", "invalid escape '\\x'"));
    CHECK(fails_with("\"\\u12G4\"", "invalid \\u escape"));
    CHECK(fails_with("\"\\u12\"", "invalid \\u escape"));
    CHECK(fails_with("\"\\ude00\"", "low surrogate without a high surrogate"));
    CHECK(fails_with("\"\\ud83d\"", "high surrogate without a low surrogate"));
    CHECK(fails_with("\"\\ud83d\\u0041\"", "high surrogate without a low surrogate"));
    CHECK(fails_with("\"\\u0000\"", "\\u0000 in a string"));
    CHECK(fails_with("\"tab\there\"", "unescaped control character 0x09"));
    CHECK(fails_with("\"new\nline\"", "unescaped control character 0x0a"));
}

static void test_strings_reject_invalid_utf8(void) {
    CHECK(fails_with("\"\xc0\x80\"", "invalid UTF-8"));          // overlong NUL
    CHECK(fails_with("\"\xe0\x80\xaf\"", "invalid UTF-8"));      // overlong '/'
    CHECK(fails_with("\"\xed\xa0\x80\"", "invalid UTF-8"));      // encoded surrogate
    CHECK(fails_with("\"\xf4\x90\x80\x80\"", "invalid UTF-8"));  // beyond U+10FFFF
    CHECK(fails_with("\"\xf5\x80\x80\x80\"", "invalid UTF-8"));
    CHECK(fails_with("\"\x80\"", "invalid UTF-8"));              // stray continuation
    CHECK(fails_with("\"\xe2\x82\"", "invalid UTF-8"));          // cut short
    CHECK(fails_with("\"\xff\"", "invalid UTF-8"));
    CHECK(agi_utf8_valid("caf\xc3\xa9", 5));
    CHECK(!agi_utf8_valid("a\0b", 3));
    CHECK(!agi_utf8_valid("\xc3", 1));
}

static void test_nesting_is_bounded(void) {
    char deep[2 * AGI_JSON_MAX_DEPTH + 8];
    for (int depth = AGI_JSON_MAX_DEPTH; depth <= AGI_JSON_MAX_DEPTH + 1; depth++) {
        int n = 0;
        for (int i = 0; i < depth; i++) deep[n++] = '[';
        for (int i = 0; i < depth; i++) deep[n++] = ']';
        deep[n] = 0;
        if (depth == AGI_JSON_MAX_DEPTH)
            CHECK(parses(deep));
        else
            CHECK(fails_with(deep, "nesting deeper than 64 levels"));
    }
    // A long run of openers fails at the limit without recursing further.
    static char flood[100000];
    memset(flood, '[', sizeof flood - 1);
    CHECK(fails_with(flood, "nesting deeper than 64 levels at byte 64"));
}

static void test_pull_reading_follows_the_document(void) {
    const char *text = "{\"name\": \"w\", \"dims\": [4, 8], \"extra\": {\"x\": [1, {}]}}";
    agi_json_init(&reader, text, strlen(text));
    char *key, *name = NULL;
    int64_t dims[2] = {0, 0};
    int ndims = 0, keys = 0;
    CHECK(agi_json_peek(&reader) == AGI_JSON_OBJECT);
    CHECK(agi_json_object_begin(&reader));
    while (agi_json_object_next(&reader, &key)) {
        keys++;
        if (strcmp(key, "name") == 0) {
            CHECK(agi_json_string(&reader, &name));
        } else if (strcmp(key, "dims") == 0) {
            CHECK(agi_json_array_begin(&reader));
            while (agi_json_array_next(&reader)) {
                agi_json_number n;
                CHECK(agi_json_number_read(&reader, &n));
                if (ndims < 2) dims[ndims++] = n.value;
            }
        } else {
            CHECK(agi_json_skip(&reader));
        }
        agi_free(key);
    }
    CHECK(!reader.failed && agi_json_finish(&reader));
    CHECK(keys == 3 && ndims == 2 && dims[0] == 4 && dims[1] == 8);
    CHECK(name && strcmp(name, "w") == 0);
    agi_free(name);
}

static void test_first_error_sticks(void) {
    agi_json_init(&reader, "[1,,2]", 6);
    CHECK(agi_json_array_begin(&reader));
    CHECK(agi_json_array_next(&reader));
    CHECK(agi_json_skip(&reader));
    CHECK(agi_json_array_next(&reader));
    CHECK(!agi_json_skip(&reader));
    char first[sizeof reader.error];
    strcpy(first, reader.error);
    CHECK(!agi_json_array_next(&reader));
    CHECK(!agi_json_finish(&reader));
    CHECK(agi_json_peek(&reader) == AGI_JSON_NONE);
    CHECK(strcmp(first, reader.error) == 0);
}

static void test_quote_escapes_like_serde_json_and_round_trips(void) {
    const char *s = "a\"b\\c\n\t\x01\x1f\x7f caf\xc3\xa9";
    char buf[128];
    size_t n = agi_json_quote(s, NULL);
    CHECK(n == agi_json_quote(s, buf));
    buf[n] = 0;
    CHECK(strcmp(buf, "\"a\\\"b\\\\c\\n\\t\\u0001\\u001f\x7f caf\xc3\xa9\"") == 0);
    char *back = string_of(buf);
    CHECK(back && strcmp(back, s) == 0);
    agi_free(back);

    ag_pcg32 rng = ag_pcg32_make(7, 1);
    for (int iter = 0; iter < 2000; iter++) {
        char src[24], quoted[24 * 6 + 3];
        int len = (int)ag_pcg32_bounded(&rng, 23);
        for (int i = 0; i < len; i++) src[i] = (char)(1 + ag_pcg32_bounded(&rng, 127));
        src[len] = 0;
        quoted[agi_json_quote(src, quoted)] = 0;
        back = string_of(quoted);
        CHECK(back && strcmp(back, src) == 0);
        agi_free(back);
    }
}

static void test_random_text_never_crashes(void) {
    // Token soup that is often nearly JSON, so the reader goes deep.
    static const char *const pieces[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "\\u",
                                         "d83d", "1", "-", "0", ".", "e", "true", "null",
                                         " ", "\"k\"", "\xc3", "\xa9", "\x00", "9999999999999999999999"};
    const int n_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    ag_pcg32 rng = ag_pcg32_make(99, 3);
    for (int iter = 0; iter < 20000; iter++) {
        char text[256];
        size_t len = 0;
        int count = (int)ag_pcg32_bounded(&rng, 40);
        for (int i = 0; i < count; i++) {
            const char *p = pieces[ag_pcg32_bounded(&rng, (uint32_t)n_pieces)];
            size_t pl = *p ? strlen(p) : 1;  // "\x00" contributes one NUL byte
            if (len + pl > sizeof text) break;
            memcpy(text + len, p, pl);
            len += pl;
        }
        agi_json_init(&reader, text, len);
        bool ok = agi_json_skip(&reader) && agi_json_finish(&reader);
        CHECK(ok != reader.failed);
        CHECK(ok || reader.error[0]);
    }
}

int main(void) {
    RUN(test_accepts_valid_documents);
    RUN(test_rejects_structural_errors_with_position);
    RUN(test_rejects_bad_literals_and_numbers);
    RUN(test_integers_are_exact_and_overflow_is_flagged);
    RUN(test_strings_decode_escapes_and_utf8);
    RUN(test_strings_reject_bad_escapes_and_surrogates);
    RUN(test_strings_reject_invalid_utf8);
    RUN(test_nesting_is_bounded);
    RUN(test_pull_reading_follows_the_document);
    RUN(test_first_error_sticks);
    RUN(test_quote_escapes_like_serde_json_and_round_trips);
    RUN(test_random_text_never_crashes);
    return testing_summary();
}
