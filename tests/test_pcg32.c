// pcg32 against the reference output published with pcg32 (pcg-c,
// test-high/expected/check-pcg32.out: seed 42, stream 54), then the properties
// dropout relies on: advance equals stepping, streams differ.
#include "testing.h"

// Five rounds of the reference demo: six outputs, the same six again after
// advancing back by 6, 65 coin flips, 33 die rolls and a shuffled deck.
static const char *const expected[5][5] = {
    {"0xa15c02b7 0x7b47f409 0xba1d3330 0x83d2f293 0xbfa4784b 0xcbed606e",
     "0xa15c02b7 0x7b47f409 0xba1d3330 0x83d2f293 0xbfa4784b 0xcbed606e",
     "HHTTTHTHHHTHTTTHHHHHTTTHHHTHTHTHTTHTTTHHHHHHTTTTHHTTTTTHTTTTTTTHT",
     "3 4 1 1 2 2 3 2 4 3 2 4 3 3 5 2 3 1 3 1 5 1 4 1 5 6 4 6 6 2 6 3 3",
     "Qd Ks 6d 3s 3d 4c 3h Td Kc 5c Jh Kd Jd As 4s 4h Ad Th Ac Jc 7s Qs 2s 7h Kh 2d 6c Ah "
     "4d Qh 9h 6s 5s 2c 9c Ts 8d 9s 3c 8c Js 5d 2h 6h 7d 8s 9d 5h 8h Qc 7c Tc"},
    {"0x74ab93ad 0x1c1da000 0x494ff896 0x34462f2f 0xd308a3e5 0x0fa83bab",
     "0x74ab93ad 0x1c1da000 0x494ff896 0x34462f2f 0xd308a3e5 0x0fa83bab",
     "HHHHHHHHHHTHHHTHTHTHTHTTTTHHTTTHHTHHTHTTHHTTTHHHHHHTHTTHTHTTTTTTT",
     "5 1 1 3 3 2 4 5 3 2 2 6 4 3 2 4 2 4 3 2 3 6 3 2 3 4 2 4 1 1 5 4 4",
     "7d 2s 7h Td 8s 3c 3d Js 2d Tc 4h Qs 5c 9c Th 2c Jc Qd 9d Qc 7s 3s 5s 6h 4d Jh 4c Ac "
     "4s 5h 5d Kc 8h 8d Jd 9s Ad 6s 6c Kd 2h 3h Kh Ts Qh 9h 6d As 7c Ks Ah 8c"},
    {"0x39af5f9f 0x04196b18 0xc3c3eb28 0xc076c60c 0xc693e135 0xf8f63932",
     "0x39af5f9f 0x04196b18 0xc3c3eb28 0xc076c60c 0xc693e135 0xf8f63932",
     "HTTHHTTTTTHTTHHHTHTTHHTTHTHHTHTHTTTTHHTTTHHTHHTTHTTHHHTHHHTHTTTHT",
     "5 1 5 3 2 2 4 5 3 3 1 3 4 6 3 2 3 4 2 2 3 1 5 2 4 6 6 4 2 4 3 3 6",
     "Kd Jh Kc Qh 4d Qc 4h 9d 3c Kh Qs 8h 5c Jd 7d 8d 3h 7c 8s 3s 2h Ks 9c 9h 2c 8c Ad 7s "
     "4s 2s 5h 6s 4c Ah 7h 5s Ac 3d 5d Qd As Tc 6h 9s 2d 6c 6d Td Jc Ts Th Js"},
    {"0x55ce6851 0x97a7726d 0x17e10815 0x58007d43 0x962fb148 0xb9bb55bd",
     "0x55ce6851 0x97a7726d 0x17e10815 0x58007d43 0x962fb148 0xb9bb55bd",
     "HHTHHTTTTHTHHHHHTTHHHTTTHHTHTHTHTHHTTHTHHHHHHTHHTHHTHHTTTTHHTHHTT",
     "6 6 3 2 3 4 2 6 4 2 6 3 2 3 5 5 3 4 4 6 6 2 6 5 4 4 6 1 6 1 3 6 5",
     "Qd 8h 5d 8s 8d Ts 7h Th Qs Js 7s Kc 6h 5s 4d Ac Jd 7d 7c Td 2c 6s 5h 6d 3s Kd 9s Jh "
     "Kh As Ah 9h 3c Qh 9c 2d Tc 9d 2s 3d Ks 4h Qc Ad Jc 8c 2h 3h 4s 4c 5c 6c"},
    {"0xfcef7cd6 0x1b488b5a 0xd0daf7ea 0x1d9a70f7 0x241a37cf 0x9a3857b7",
     "0xfcef7cd6 0x1b488b5a 0xd0daf7ea 0x1d9a70f7 0x241a37cf 0x9a3857b7",
     "HHHHTHHTTHTTHHHTTTHHTHTHTTTTHTTHTHTTTHHHTHTHTTHTTHTHHTHTHHHTHTHTT",
     "5 4 1 2 6 1 3 1 5 6 3 6 2 1 4 4 5 2 1 5 6 5 6 4 4 4 5 2 6 4 3 5 6",
     "4d 9s Qc 9h As Qs 7s 4c Kd 6h 6s 2c 8c 5d 7h 5h Jc 3s 7c Jh Js Ks Tc Jd Kc Th 3h Ts "
     "Qh Ad Td 3c Ah 2d 3d 5c Ac 8s 5s 9c 2h 6c 6d Kh Qd 8d 7d 2s 8h 4h 9d 4s"},
};

static void append(char *buf, size_t size, const char *s) {
    size_t n = strlen(buf);
    snprintf(buf + n, size - n, "%s%s", n ? " " : "", s);
}

static void test_reference_output_seed_42_stream_54(void) {
    ag_pcg32 rng;
    ag_pcg32_seed(&rng, 42u, 54u);
    for (int round = 0; round < 5; round++) {
        char got[5][512] = {{0}}, item[16];
        for (int i = 0; i < 6; i++) {
            snprintf(item, sizeof item, "0x%08x", ag_pcg32_next(&rng));
            append(got[0], sizeof got[0], item);
        }
        ag_pcg32_advance(&rng, (uint64_t)-6);  // step back six and replay
        for (int i = 0; i < 6; i++) {
            snprintf(item, sizeof item, "0x%08x", ag_pcg32_next(&rng));
            append(got[1], sizeof got[1], item);
        }
        for (int i = 0; i < 65; i++) got[2][i] = ag_pcg32_bounded(&rng, 2) ? 'H' : 'T';
        for (int i = 0; i < 33; i++) {
            snprintf(item, sizeof item, "%u", ag_pcg32_bounded(&rng, 6) + 1);
            append(got[3], sizeof got[3], item);
        }
        int cards[52];
        for (int i = 0; i < 52; i++) cards[i] = i;
        for (int i = 52; i > 1; i--) {
            uint32_t chosen = ag_pcg32_bounded(&rng, (uint32_t)i);
            int card = cards[chosen];
            cards[chosen] = cards[i - 1];
            cards[i - 1] = card;
        }
        for (int i = 0; i < 52; i++) {
            snprintf(item, sizeof item, "%c%c", "A23456789TJQK"[cards[i] / 4],
                     "hcds"[cards[i] % 4]);
            append(got[4], sizeof got[4], item);
        }
        for (int line = 0; line < 5; line++) {
            if (strcmp(got[line], expected[round][line]) != 0) {
                fprintf(stderr, "round %d line %d:\n  got      %s\n  expected %s\n", round + 1,
                        line, got[line], expected[round][line]);
                CHECK(!"pcg32 output differs from the reference");
            }
        }
    }
}

static void test_advance_equals_stepping(void) {
    ag_pcg32 a = ag_pcg32_make(7, 3), b = a;
    for (int i = 0; i < 12345; i++) ag_pcg32_next(&a);
    ag_pcg32_advance(&b, 12345);
    CHECK(a.state == b.state && a.inc == b.inc);
    CHECK(ag_pcg32_next(&a) == ag_pcg32_next(&b));
    ag_pcg32_advance(&b, 0);
    CHECK(a.state == b.state);
}

// Bound 0 is 2^32, the whole range: one plain output, where the reference's
// threshold -bound % bound divides by zero.
static void test_bound_zero_is_the_full_range(void) {
    ag_pcg32 a = ag_pcg32_make(5, 9), b = a;
    for (int i = 0; i < 100; i++) CHECK(ag_pcg32_bounded(&a, 0) == ag_pcg32_next(&b));
    CHECK(a.state == b.state);
}

static void test_streams_are_distinct(void) {
    ag_pcg32 a = ag_pcg32_make(42, 1), b = ag_pcg32_make(42, 2);
    int same = 0;
    for (int i = 0; i < 1000; i++) same += ag_pcg32_next(&a) == ag_pcg32_next(&b);
    CHECK(same < 5);
}

static void test_uniform_and_normal_moments(void) {
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    double s = 0, s2 = 0, lo = 1, hi = 0, n1 = 0, n2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double u = ag_pcg32_double(&rng);
        float f = ag_pcg32_float(&rng);
        CHECK(u >= 0.0 && u < 1.0);
        CHECK(f >= 0.0f && f < 1.0f);
        lo = fmin(lo, u);
        hi = fmax(hi, u);
        s += u;
        s2 += u * u;
        double z = ag_pcg32_normal(&rng);
        n1 += z;
        n2 += z * z;
    }
    CHECK_NEAR(s / n, 0.5, 0.01);
    CHECK_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12.0, 0.01);
    CHECK(lo < 1e-4 && hi > 1 - 1e-4);
    CHECK_NEAR(n1 / n, 0.0, 0.01);
    CHECK_NEAR(n2 / n, 1.0, 0.02);
}

int main(void) {
    RUN(test_reference_output_seed_42_stream_54);
    RUN(test_advance_equals_stepping);
    RUN(test_bound_zero_is_the_full_range);
    RUN(test_streams_are_distinct);
    RUN(test_uniform_and_normal_moments);
    return testing_summary();
}
