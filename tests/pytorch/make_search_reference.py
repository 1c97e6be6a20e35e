"""Writes tests/reference/search_reference.h: what beam search (and greedy search) as
Hugging Face's BeamSearchScorer and fairseq define them returns on fixed scores, for
tests/test_search.c.

Run by hand, never by CI (plain Python, no torch):
    python3 tests/pytorch/make_search_reference.py

This is a second implementation of the definition in include/attograd/generate.h,
written as the definition reads and independently of src/nn/search.c: every
continuation of every live beam is listed and sorted, finished hypotheses are kept in
a list sorted at each insertion, as Hugging Face's BeamHypotheses keeps them:
  - a step of input b takes the 2K best continuations of its live beams by summed
    log-probability (ties: lower beam, then lower token); walking them in order, an
    end token among the first K finishes a hypothesis, scored sum / n^alpha with n its
    generated length, end token included; any other continuation becomes a live beam
    until K are live; at the first step only one beam is live;
  - an input keeps its K best finished hypotheses (a newcomer replaces the worst only
    if strictly better); it is done when it has K and the stopping rule agrees:
    "heuristic" (early_stopping=False): worst >= best continuation's sum / t^alpha;
    "early" (True): at once; "never": as heuristic, with max_new^alpha when alpha > 0;
  - at max_new tokens, the live beams of an input not done are finished by their
    length.
Greedy (K = 1) takes the argmax (lowest token among equals) until the end token.

The scores: the model's next-token score of token v after (input b, tokens so far)
comes from a 64-bit hash of b and the tokens (FNV-1a), spread by splitmix64, as a
double in [-4, 4), and the end token gets 0.5 per generated token minus 1 more, so
hypotheses end at various lengths. Every operation on doubles here is exact or
rounded as C rounds it (glibc's exp, log and pow, summed in the same order), so the
C test computes the same scores.
"""
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "reference", "search_reference.h")
MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def scores(b, tokens, vocab, start_len, end):
    h = 0xCBF29CE484222325
    for t in [b] + list(tokens):
        h = ((h ^ (t + 1)) * 0x100000001B3) & MASK
    z = []
    for v in range(vocab):
        x = splitmix64((h + v * 0x9E3779B97F4A7C15) & MASK)
        z.append((x >> 11) * 2.0 ** -53 * 8.0 - 4.0)
    if end >= 0:
        z[end] += 0.5 * (len(tokens) - start_len) - 1.0
    return z


def log_softmax(z):
    m = max(z)
    s = 0.0
    for x in z:
        s += math.exp(x - m)
    lse = m + math.log(s)
    return [x - lse for x in z]


class Finished:
    """An input's K best finished hypotheses, as BeamHypotheses keeps them."""

    def __init__(self, k, alpha):
        self.k, self.alpha, self.hyps, self.arrivals = k, alpha, [], 0

    def add(self, tokens, total):
        score = total / len(tokens) ** self.alpha
        if len(self.hyps) == self.k:
            # the worst: lowest score, the later arrival among equals
            worst = min(self.hyps, key=lambda h: (h[0], -h[3]))
            if not score > worst[0]:
                return
            self.hyps.remove(worst)
        self.hyps.append((score, list(tokens), total, self.arrivals))
        self.arrivals += 1

    def worst(self):
        return min(h[0] for h in self.hyps)

    def best(self, r):
        return sorted(self.hyps, key=lambda h: (-h[0], h[3]))[:r]


def beam_search(b, start, vocab, k, alpha, stop, end, max_new, r):
    start_len = len(start)
    beams = [(list(start), 0.0)]  # one live beam at the first step
    finished = Finished(k, alpha)
    done = False
    for t in range(1, max_new + 1):
        cands = []
        for i, (toks, total) in enumerate(beams):
            lp = log_softmax(scores(b, toks, vocab, start_len, end))
            for v in range(vocab):
                cands.append((total + lp[v], i * vocab + v, i, v))
        cands.sort(key=lambda c: (-c[0], c[1]))
        cands = cands[: 2 * k]
        nxt = []
        for rank, (total, _, i, v) in enumerate(cands):
            if len(nxt) == k:
                break
            if v == end:
                if rank < k:
                    finished.add(beams[i][0][start_len:] + [v], total)
            else:
                nxt.append((beams[i][0] + [v], total))
        if len(finished.hyps) == k:
            best = cands[0][0]
            if stop == "early":
                done = True
            else:
                n = max_new if stop == "never" and alpha > 0 else t
                done = finished.worst() >= best / n ** alpha
        if done:
            break
        beams = nxt
    if not done:
        for toks, total in beams:
            finished.add(toks[start_len:], total)
    return [(h[1], h[0]) for h in finished.best(r)]


def greedy(b, start, vocab, alpha, end, max_new):
    toks, total = list(start), 0.0
    for t in range(1, max_new + 1):
        lp = log_softmax(scores(b, toks, vocab, len(start), end))
        v = max(range(vocab), key=lambda u: (lp[u], -u))
        toks.append(v)
        total += lp[v]
        if v == end:
            break
    gen = toks[len(start):]
    return [(gen, total / len(gen) ** alpha)]


# name, batch, vocab, start tokens per input, beams, alpha, stop, end, max_new, returned
CASES = [
    ("k3_alpha1_heuristic", 3, 7, [[1], [2], [3]], 3, 1.0, "heuristic", 0, 6, 3),
    ("k2_alpha0_early", 3, 7, [[4], [5], [6]], 2, 0.0, "early", 2, 5, 2),
    ("k4_alpha2_never", 2, 7, [[1, 2], [3, 4]], 4, 2.0, "never", 1, 7, 4),
    ("k3_alpha_negative", 3, 7, [[0], [1], [2]], 3, -0.5, "heuristic", 0, 6, 1),
    ("k3_no_end_token", 2, 7, [[3], [4]], 3, 1.0, "heuristic", -1, 4, 3),
    ("k3_vocab_below_2k", 2, 4, [[1], [2]], 3, 1.0, "heuristic", 3, 5, 3),
    ("k5_long", 2, 9, [[7], [8]], 5, 0.6, "heuristic", 0, 12, 5),
    ("greedy_alpha1", 3, 7, [[1], [2], [3]], 1, 1.0, "heuristic", 0, 8, 1),
    ("greedy_no_end", 2, 7, [[1, 5], [2, 6]], 1, 0.0, "heuristic", -1, 5, 1),
]
STOPS = {"heuristic": "AG_BEAM_STOP_HEURISTIC", "early": "AG_BEAM_STOP_EARLY",
         "never": "AG_BEAM_STOP_NEVER"}


def main():
    lines = ["// Generated by tests/pytorch/make_search_reference.py: do not edit.",
             "// Beam and greedy search on fixed scores, from an independent Python",
             "// implementation of the definition in attograd/generate.h.",
             "#define SEARCH_REF_MAX_NEW 12", "#define SEARCH_REF_MAX_START 2",
             "#define SEARCH_REF_MAX_OUT 15", "typedef struct search_ref {",
             "    const char *name;", "    int batch, vocab, start_len, beams;",
             "    double alpha;", "    ag_beam_stop stop;", "    int end, max_new, num_return;",
             "    int start[3][SEARCH_REF_MAX_START];",
             "    int tokens[SEARCH_REF_MAX_OUT][SEARCH_REF_MAX_NEW];  // batch * num_return rows",
             "    int lengths[SEARCH_REF_MAX_OUT];", "    double scores[SEARCH_REF_MAX_OUT];",
             "} search_ref;", "static const search_ref search_refs[] = {"]
    for name, batch, vocab, start, k, alpha, stop, end, max_new, r in CASES:
        assert max_new <= 12 and batch * r <= 15 and len(start[0]) <= 2
        rows = []
        for b in range(batch):
            if k == 1:
                res = greedy(b, start[b], vocab, alpha, end, max_new)
            else:
                res = beam_search(b, start[b], vocab, k, alpha, stop, end, max_new, r)
            res += [([], float("-inf"))] * (r - len(res))
            rows += res
        toks = ", ".join("{" + ", ".join(str(t) for t in (g + [-1] * (max_new - len(g)))) + "}"
                         for g, _ in rows)
        lens = ", ".join(str(len(g)) for g, _ in rows)
        scs = ", ".join("-INFINITY" if s == float("-inf") else repr(s) for _, s in rows)
        starts = ", ".join("{" + ", ".join(str(t) for t in s) + "}" for s in start)
        lines.append(f'    {{"{name}", {batch}, {vocab}, {len(start[0])}, {k}, {alpha!r}, '
                     f'{STOPS[stop]}, {end}, {max_new}, {r},')
        lines.append(f"     {{{starts}}},")
        lines.append(f"     {{{toks}}},")
        lines.append(f"     {{{lens}}},")
        lines.append(f"     {{{scs}}}}},")
    lines.append("};")
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
