#!/usr/bin/python3
"""Writes tests/reference/gqa_pytorch.safetensors: grouped-query and multi-query
attention (ag_mha_config.num_kv_heads), written out in PyTorch from the definition,
since torch has no such module: the key and value projections make h_kv heads, each
repeated h / h_kv times (repeat_interleave on the head dim: query head i reads kv head
i // (h / h_kv), as scaled_dot_product_attention(..., enable_gqa=True) of PyTorch 2.5),
then plain attention -- scaled scores, a position scheme (rope on q and k before the
repetition, or a bias: relative, t5, alibi), the masks (causal, key padding, an additive
attn_mask [T, S] requiring grad), softmax, the values, out_proj. Float64, autograd's
gradients. tests/test_mha_pytorch.c replays every case through ag_mha_forward on both of
its paths (fused and composed), in float64 and float32.

Parameters, under the names ag_mha_init gives them (nn.MultiheadAttention's separate
projection form with narrower key and value projections): q_proj_weight [h*d, E],
k_proj_weight [h_kv*d, E] (or kdim), v_proj_weight [h_kv*d, E], in_proj_bias
[(h + 2 h_kv) d], out_proj.weight [E, h*d], out_proj.bias [E], and
relative_attention_bias.weight for relative and t5.

Layout as make_mha_options_reference.py's (kind "gqa"; args add kvh and d).

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_gqa_reference.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402
from make_mha_options_reference import rand, written_case  # noqa: E402

OUT = os.path.join(ROOT, "tests", "reference", "gqa_pytorch.safetensors")


def gqa_case(args, B, T, S, kpm=False, additive=False):
    E, h, kvh, d = args["E"], args["h"], args["kvh"], args["d"]
    if kvh == h:  # plain attention: ag_mha_init packs the projections, as PyTorch
        proj = {"in_proj_weight": rand(3 * h * d, E, lo=-0.6, hi=0.6),
                "in_proj_bias": rand(3 * h * d, lo=-0.5, hi=0.5),
                "out_proj.weight": rand(E, h * d, lo=-0.6, hi=0.6),
                "out_proj.bias": rand(E, lo=-0.5, hi=0.5)}
        return written_case(args, B, T, S, E, h, d, proj, kpm, additive)
    proj = {"q_proj_weight": rand(h * d, E, lo=-0.6, hi=0.6),
            "k_proj_weight": rand(kvh * d, E, lo=-0.6, hi=0.6),
            "v_proj_weight": rand(kvh * d, E, lo=-0.6, hi=0.6),
            "in_proj_bias": rand((h + 2 * kvh) * d, lo=-0.5, hi=0.5),
            "out_proj.weight": rand(E, h * d, lo=-0.6, hi=0.6),
            "out_proj.bias": rand(E, lo=-0.5, hi=0.5)}
    # The definition: k and v of h_kv heads, each repeated for the h / h_kv query heads
    # of its group (written_case's repeat_interleave), then plain attention.
    return written_case(args, B, T, S, E, h, d, proj, kpm, additive)


def write_cases(out, seed, kind, cases):
    """Each case (args, T, S) through gqa_case (B = 2; key padding and the additive mask
    when args say kpm=1, additive=1), after seeding torch, into `out` as
    make_mha_options_reference.py lays its cases out, of kind `kind`."""
    torch.manual_seed(seed)
    tensors, meta = {}, {}
    for n, (args, T, S) in enumerate(cases):
        meta["c%d.kind" % n] = kind
        meta["c%d.args" % n] = " ".join("%s=%s" % kv for kv in args.items())
        t = gqa_case(args, 2, T, S, kpm=args.get("kpm") == 1, additive=args.get("additive") == 1)
        for name, value in t.items():
            tensors["c%d.%s" % (n, name)] = value
    meta["cases"] = str(len(cases))
    meta["written_by"] = "torch " + torch.__version__
    sio.save(tensors, out, meta)
    print("wrote %d cases to %s" % (len(cases), os.path.relpath(out, ROOT)))


def main():
    A = dict
    write_cases(OUT, 20261126, "gqa", [
        (A(E=8, h=4, kvh=2, d=2, self=1, causal=1), 6, 6),
        (A(E=12, h=4, kvh=2, d=3, kpm=1), 5, 7),  # odd head dim, cross, T != S
        (A(E=8, h=4, kvh=1, d=2, self=1, causal=1, additive=1), 5, 5),  # multi-query
        (A(E=8, h=4, kvh=1, d=3, causal=1), 4, 6),  # multi-query, odd d, causal T != S
        (A(E=16, h=4, kvh=2, d=4, pos="rope", base=10000.0, self=1, causal=1), 7, 7),
        (A(E=12, h=6, kvh=3, d=2, pos="rope", base=500.0, kpm=1), 4, 6),
        (A(E=12, h=4, kvh=2, d=3, pos="alibi", causal=1), 4, 6),
        (A(E=8, h=4, kvh=2, d=2, pos="t5", buckets=8, maxd=20, self=1, kpm=1), 9, 9),
        (A(E=10, h=2, kvh=1, d=5, pos="relative", M=2, causal=1, additive=1), 6, 4),
    ])


if __name__ == "__main__":
    main()
