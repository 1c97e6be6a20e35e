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


def main():
    torch.manual_seed(20261126)
    tensors, meta = {}, {}
    n = 0

    def add(args, t):
        nonlocal n
        meta["c%d.kind" % n] = "gqa"
        meta["c%d.args" % n] = " ".join("%s=%s" % kv for kv in args.items())
        for name, value in t.items():
            tensors["c%d.%s" % (n, name)] = value
        n += 1

    A = dict
    B = 2
    a = A(E=8, h=4, kvh=2, d=2, self=1, causal=1)
    add(a, gqa_case(a, B, 6, 6))
    a = A(E=12, h=4, kvh=2, d=3, kpm=1)  # odd head dim, cross, T != S
    add(a, gqa_case(a, B, 5, 7, kpm=True))
    a = A(E=8, h=4, kvh=1, d=2, self=1, causal=1, additive=1)  # multi-query
    add(a, gqa_case(a, B, 5, 5, additive=True))
    a = A(E=8, h=4, kvh=1, d=3, causal=1)  # multi-query, odd d, causal T != S
    add(a, gqa_case(a, B, 4, 6))
    a = A(E=16, h=4, kvh=2, d=4, pos="rope", base=10000.0, self=1, causal=1)
    add(a, gqa_case(a, B, 7, 7))
    a = A(E=12, h=6, kvh=3, d=2, pos="rope", base=500.0, kpm=1)
    add(a, gqa_case(a, B, 4, 6, kpm=True))
    a = A(E=12, h=4, kvh=2, d=3, pos="alibi", causal=1)
    add(a, gqa_case(a, B, 4, 6))
    a = A(E=8, h=4, kvh=2, d=2, pos="t5", buckets=8, maxd=20, self=1, kpm=1)
    add(a, gqa_case(a, B, 9, 9, kpm=True))
    a = A(E=10, h=2, kvh=1, d=5, pos="relative", M=2, causal=1, additive=1)
    add(a, gqa_case(a, B, 6, 4, additive=True))
    meta["cases"] = str(n)
    meta["written_by"] = "torch " + torch.__version__
    sio.save(tensors, OUT, meta)
    print("wrote %d cases to %s" % (n, os.path.relpath(OUT, ROOT)))


if __name__ == "__main__":
    main()
