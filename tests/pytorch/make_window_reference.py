#!/usr/bin/python3
"""Writes tests/reference/window_pytorch.safetensors: sliding-window (local) attention
(ag_mha_config.window = W), written out in PyTorch from the definition, since torch 1.13
has none: the attention of make_gqa_reference.py with every key at distance W or more
from its query masked, |i - j| >= W, on top of the causal mask when causal -- a query
then sees the last W keys, itself included (Mistral's sliding_window as HuggingFace
counts it), and without causal the keys within W - 1 on each side. With grouped-query
attention, position schemes, masks, cross-attention and T != S. tests/test_mha_pytorch.c
replays every case through ag_mha_forward on both of its paths, in float64 and float32.

Layout as make_mha_options_reference.py's (kind "window"; args as make_gqa_reference.py's
plus window).

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_window_reference.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_gqa_reference import ROOT, write_cases  # noqa: E402

OUT = os.path.join(ROOT, "tests", "reference", "window_pytorch.safetensors")


def main():
    A = dict
    write_cases(OUT, 20261127, "window", [
        (A(E=8, h=2, kvh=2, d=4, self=1, causal=1, window=3), 9, 9),
        (A(E=8, h=2, kvh=2, d=4, self=1, window=2), 7, 7),  # bidirectional: 3 keys each
        (A(E=12, h=4, kvh=2, d=3, window=2, kpm=1), 6, 8),  # cross, T != S, odd d
        (A(E=8, h=4, kvh=1, d=2, self=1, causal=1, window=1, additive=1), 5, 5),  # itself
        (A(E=16, h=4, kvh=2, d=4, pos="rope", base=10000.0, self=1, causal=1, window=4), 11, 11),
        (A(E=12, h=4, kvh=2, d=3, pos="alibi", causal=1, self=1, window=3), 8, 8),
        (A(E=8, h=2, kvh=1, d=4, pos="t5", buckets=8, maxd=20, window=3, kpm=1), 7, 9),
        (A(E=10, h=2, kvh=2, d=5, pos="relative", M=2, self=1, causal=1, window=5), 12, 12),
    ])


if __name__ == "__main__":
    main()
