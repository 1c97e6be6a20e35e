#!/usr/bin/python3
"""Writes tests/reference/attention_pytorch.safetensors: attention with the
options of issue 11 (mask polarity, broadcast masks, position bias inside the
softmax: relative, T5, ALiBi), rotary embedding, and NaN inputs, computed by
explicit PyTorch code in float64, with autograd's gradients.

tests/test_attention_pytorch.c replays each case through attograd (the fused
ag_attention and the composed matmul, softmax, matmul) in float64 and float32.

Every float input is rounded to a value float32 represents exactly.

Layout: case i stores "c<i>.<name>" tensors (inputs q, k, v or x, table,
add, mask, kpm, grad_out; results out, grad.q, grad.k, grad.v, grad.x,
grad.table, grad.add) and metadata "c<i>.kind" ("attention" or "rope") and
"c<i>.args" ("key=value" pairs); "cases" is the number of cases.

attograd's documented choice where it differs from PyTorch: a query whose
keys are all masked gives zeros (PyTorch: NaN); encoded below with torch.where.

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_attention_reference.py
"""
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402

OUT = os.path.join(ROOT, "tests", "reference", "attention_pytorch.safetensors")
torch.manual_seed(20261123)
D = torch.float64


def rand(*shape):
    return (torch.rand(*shape, dtype=D) * 2 - 1).float().double()


def t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """HuggingFace T5Attention._relative_position_bucket, as written there."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1))
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def alibi_slopes(n):
    """The ALiBi paper's get_slopes."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_2(p) + alibi_slopes(2 * p)[0::2][: n - p]


def position_bias(args, table, h, T, S):
    rel = torch.arange(S)[None, :] - torch.arange(T)[:, None]  # j - i
    kind = args.get("pos", "none")
    if kind == "relative":
        M = args["M"]
        return table[:, rel.clamp(-M, M) + M]
    if kind == "t5":
        b = t5_bucket(rel, args["bidir"] == 1, args["buckets"], args["maxd"])
        return table[:, b]
    if kind == "alibi":
        s = torch.tensor(alibi_slopes(h), dtype=D)[:, None, None]
        return -s * rel.abs() if args["bidir"] == 1 else s * rel
    return None


def attention_case(args, B, h, T, S, d, add_shape=None, mask_shape=None, kpm=False,
                   poison=None):
    q, k, v = rand(B, h, T, d), rand(B, h, S, d), rand(B, h, S, d)
    if poison == "q":
        q[0, 0, 1, 0] = float("nan")
    if poison == "k":
        k[0, 0, 1, 0] = float("nan")
    if poison == "v":
        v[0, 0, 1, 0] = float("nan")
    if poison == "infk":
        k[0, 0, S - 1, 0] = float("inf")
    t = {"q": q, "k": k, "v": v}
    grads = ["q", "k", "v"]
    kind = args.get("pos", "none")
    table = None
    if kind == "relative":
        table = rand(h, 2 * args["M"] + 1)
    elif kind == "t5":
        table = rand(h, args["buckets"])
    if table is not None:
        t["table"] = table
        grads.append("table")
    if add_shape:
        t["add"] = rand(*add_shape)
        grads.append("add")
    if mask_shape:
        t["mask"] = torch.rand(*mask_shape) < 0.3
    if kpm:
        t["kpm"] = torch.rand(B, S) < 0.25
    for name in grads:
        t[name].requires_grad_(True)
    s = (t["q"] @ t["k"].transpose(-1, -2)) * args["scale"]
    bias = position_bias(args, t.get("table"), h, T, S)
    if bias is not None:
        s = s + bias[None]
    if add_shape:
        s = s + t["add"]
    keeps = args.get("keeps", 0) == 1
    masked = torch.zeros(B, h, T, S, dtype=torch.bool)
    if mask_shape:
        m = t["mask"]
        masked = masked | (m if not keeps else ~m)
    if kpm:
        p = t["kpm"][:, None, None, :]
        masked = masked | (p if not keeps else ~p)
    if args.get("causal", 0) == 1:
        masked = masked | (torch.arange(S)[None, :] > torch.arange(T)[:, None])
    s = s.masked_fill(masked, float("-inf"))
    w = torch.softmax(s, -1)
    w = torch.where(masked.all(-1, keepdim=True), torch.zeros_like(w), w)
    out = w @ t["v"]
    g = rand(*out.shape)
    out.backward(g)
    t["grad_out"] = g
    t["out"] = out.detach()
    for name in grads:
        t["grad." + name] = t[name].grad
    for name in list(t):
        t[name] = t[name].detach()
    return t


def rope_case(args, shape):
    x = rand(*shape).requires_grad_(True)
    heads = args["heads"]
    if heads:  # [B, T, h*d] -> [B, h, T, d]
        B, T, E = shape
        x4 = x.view(B, T, heads, E // heads).transpose(1, 2)
    else:
        x4 = x
    d, T = x4.shape[-1], x4.shape[-2]
    base = args["base"]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=D) / d))
    pos = torch.arange(T, dtype=D) + args["offset"]
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x1, x2 = x4[..., : d // 2], x4[..., d // 2:]
    y4 = x4 * cos + torch.cat((-x2, x1), dim=-1) * sin
    y = y4.transpose(1, 2).reshape(shape) if heads else y4
    g = rand(*shape)
    y.backward(g)
    return {"x": x.detach(), "grad_out": g, "out": y.detach(), "grad.x": x.grad}


def main():
    tensors, meta = {}, {}
    cases = []

    def add(kind, args, t):
        i = len(cases)
        cases.append(i)
        meta["c%d.kind" % i] = kind
        meta["c%d.args" % i] = " ".join("%s=%s" % kv for kv in args.items())
        for name, value in t.items():
            tensors["c%d.%s" % (i, name)] = value

    A = dict
    # Position bias, each scheme, with masks of several broadcast shapes.
    add("attention", A(pos="relative", M=3, scale=0.5),
        attention_case(A(pos="relative", M=3, scale=0.5), 2, 3, 5, 7, 4))
    a = A(pos="relative", M=2, scale=0.4, causal=1)
    add("attention", a, attention_case(a, 2, 2, 6, 6, 3, add_shape=(2, 1, 1, 6), kpm=True))
    a = A(pos="t5", buckets=8, maxd=20, bidir=1, scale=0.3)
    add("attention", a, attention_case(a, 1, 2, 40, 40, 4))
    a = A(pos="t5", buckets=6, maxd=16, bidir=0, scale=0.3, causal=1)
    add("attention", a, attention_case(a, 2, 2, 24, 24, 3, mask_shape=(2, 1, 24, 24)))
    a = A(pos="alibi", heads=4, bidir=1, scale=0.5)
    add("attention", a, attention_case(a, 1, 4, 9, 11, 4, add_shape=(9, 11)))
    a = A(pos="alibi", heads=3, bidir=0, scale=0.5, causal=1)
    add("attention", a, attention_case(a, 2, 3, 7, 7, 4))
    a = A(pos="alibi", heads=6, bidir=1, scale=0.5)
    add("attention", a, attention_case(a, 1, 6, 4, 4, 2))
    # Broadcast masks and polarity, no position bias.
    a = A(scale=0.5, keeps=1)
    add("attention", a, attention_case(a, 2, 2, 5, 6, 3, mask_shape=(2, 1, 1, 6), kpm=True))
    a = A(scale=0.5)
    add("attention", a, attention_case(a, 2, 2, 5, 6, 3, add_shape=(1, 1, 5, 6),
                                       mask_shape=(2, 1, 5, 6)))
    a = A(scale=0.5, keeps=1)
    add("attention", a, attention_case(a, 2, 3, 4, 5, 3, add_shape=(1, 3, 4, 5),
                                       mask_shape=(4, 5)))
    # NaN: PyTorch's NaN where attograd must give NaN.
    for poison in ("q", "k", "infk"):
        a = A(scale=0.5, poison=poison)
        add("attention", a, attention_case(a, 2, 2, 4, 5, 3, poison=poison))
    # Rotary embedding.
    a = A(heads=0, base=10000.0, offset=0)
    add("rope", a, rope_case(a, (2, 3, 5, 8)))
    a = A(heads=2, base=500.0, offset=7)
    add("rope", a, rope_case(a, (2, 4, 12)))
    a = A(heads=0, base=10000.0, offset=3)
    add("rope", a, rope_case(a, (1, 1, 1, 2)))
    # NaN in v (last, so that the cases above keep their values): every output of that
    # head at that column is NaN, and so are q's and k's gradients there; v's are not.
    a = A(scale=0.5, poison="v")
    add("attention", a, attention_case(a, 2, 2, 4, 5, 3, poison="v"))
    meta["cases"] = str(len(cases))
    sio.save(tensors, OUT, meta)
    print("wrote %d cases to %s" % (len(cases), OUT))


if __name__ == "__main__":
    main()
