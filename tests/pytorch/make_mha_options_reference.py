#!/usr/bin/python3
"""Writes tests/reference/mha_options_pytorch.safetensors: MultiheadAttention with what
the attograd-mha tool does not take, computed by PyTorch in float64 with autograd's
gradients. tests/test_mha_pytorch.c replays every case through ag_mha_forward on both
of its paths (fused: no weights; composed: weights), in float64 and float32.

kind "masks": torch.nn.MultiheadAttention(batch_first=True) in eval mode, with
    add_bias_kv and/or add_zero_attn, causal, and an attn_mask of a shape that
    broadcasts to [B, h, T, S] ([B,1,1,S], [B,1,T,S], [T,S], [S], ...): bool in either
    polarity, or additive (requiring grad). attograd gets the mask as stored. torch 1.13
    takes only [T,S] or [B*h,T,S], true = masked, and has no is_causal: it gets the
    mask expanded to [B*h, T, S] (a differentiable expand of the additive one, so its
    gradient arrives summed back to the stored shape), inverted for keeps=1, and the
    causal triangle torch.ones(T, S).triu(1) or'ed into a bool mask or filled into an
    additive one as -inf. A key padding mask is inverted the same way for keeps=1.
kind "positions": MultiheadAttention with a position scheme inside the attention,
    written out in PyTorch (nothing in torch 1.13 has it): q, k, v = the rows of
    in_proj_weight and in_proj_bias; per head, rope (rotate_half, base `base`) on q and
    k, or a bias added to the scaled scores -- relative (a learned table [h, 2M+1] at
    clip(j - i, -M, M) + M), t5 (HuggingFace's T5 buckets of j - i) or alibi (the
    paper's slopes), bidirectional unless causal, as ag_mha_config's pos does; then
    the key padding and causal masks, softmax, the values, out_proj. The table
    relative_attention_bias.weight is a parameter with its gradient.

Every float input and parameter is a value float32 represents exactly; the results are
float64 (the float32 runs are compared with them at float32's tolerance). No query has
every key masked (PyTorch gives NaN there, attograd zeros).

Layout: case i stores "c<i>.param.<name>" (PyTorch's state_dict names), "c<i>.query"
(and "c<i>.key", "c<i>.value" unless self=1: then query is also key and value, and its
gradient is the sum), "c<i>.mask", "c<i>.kpm", "c<i>.grad_out", and the results
"c<i>.out", "c<i>.grad.<input>", "c<i>.grad.param.<name>", "c<i>.grad.mask" (additive);
metadata "c<i>.kind" and "c<i>.args" ("key=value" pairs); "cases" is their number.

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_mha_options_reference.py
"""
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402
from make_attention_reference import position_bias  # noqa: E402  (T5 buckets, ALiBi slopes)

OUT = os.path.join(ROOT, "tests", "reference", "mha_options_pytorch.safetensors")
D = torch.float64


def rand(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(*shape, dtype=D) * (hi - lo) + lo).float().double()


def as4d(t):
    """t with its dims right-aligned to 4 (leading ones)."""
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))


def inputs(B, T, S, E, self_attn):
    t = {"query": rand(B, T, E, lo=-1.5, hi=1.5)}
    if not self_attn:
        t["key"] = rand(B, S, E, lo=-1.5, hi=1.5)
        t["value"] = rand(B, S, E, lo=-1.5, hi=1.5)
    for x in t.values():
        x.requires_grad_(True)
    return t


def finish(t, out, params, grads):
    """Backward with a random grad_out; the results into t (detached)."""
    g = rand(*out.shape)
    out.backward(g)
    t["grad_out"] = g
    t["out"] = out.detach()
    for name, p in params.items():
        t["param." + name] = p.detach().clone()
        t["grad.param." + name] = p.grad
    for name in grads:
        t["grad." + name] = t[name].grad
    for name in list(t):
        t[name] = t[name].detach()
    assert all(torch.isfinite(v).all() for n, v in t.items() if v.is_floating_point())
    return t


def masks_case(args, B, T, S, E, h, mask_shape, additive=False, kpm=False):
    """torch.nn.MultiheadAttention with the extra keys, on a broadcast mask."""
    mha = torch.nn.MultiheadAttention(E, h, batch_first=True, dtype=D,
                                      add_bias_kv=args.get("bias_kv", 0) == 1,
                                      add_zero_attn=args.get("zero_attn", 0) == 1).eval()
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(rand(*p.shape, lo=-0.7, hi=0.7))
    self_attn = args.get("self", 0) == 1
    t = inputs(B, T, S, E, self_attn)
    keeps = args.get("keeps", 0) == 1
    grads = list(t)
    tri = torch.ones(T, S, dtype=torch.bool).triu(1)
    causal = args.get("causal", 0) == 1
    if additive:
        t["mask"] = rand(*mask_shape, lo=-2, hi=2).requires_grad_(True)
        grads.append("mask")
        am = as4d(t["mask"]).expand(B, h, T, S).reshape(B * h, T, S)
        if causal:
            am = am.masked_fill(tri, float("-inf"))
    else:
        masked = torch.rand(*mask_shape) < 0.35
        t["mask"] = ~masked if keeps else masked
        am = as4d(masked).expand(B, h, T, S).reshape(B * h, T, S)
        if causal:
            am = am | tri
    kpm_t = None
    if kpm:
        kpm_t = torch.rand(B, S) < 0.3
        t["kpm"] = ~kpm_t if keeps else kpm_t
    q = t["query"]
    k, v = (q, q) if self_attn else (t["key"], t["value"])
    out, _ = mha(q, k, v, key_padding_mask=kpm_t, attn_mask=am, need_weights=False)
    return finish(t, out, dict(mha.named_parameters()), grads)


def rope(x, base):
    """rotate_half rotary embedding of x [B, h, L, d], positions 0 .. L-1."""
    d, L = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=D) / d))
    freqs = torch.outer(torch.arange(L, dtype=D), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * emb.cos() + torch.cat((-x2, x1), dim=-1) * emb.sin()


def written_case(args, B, T, S, E, h, d, proj, kpm=False, additive=False):
    """MultiheadAttention written out: proj holds the projections, in_proj_weight [3hd, E]
    or q_proj_weight [hd, E], k_proj_weight and v_proj_weight [h_kv d, E], in_proj_bias
    (q's, k's, v's) and out_proj.*; the position table joins them (relative, t5). Then
    per head: rope (rotate_half, base `base`) on q and k; k and v repeated to h heads
    (repeat_interleave: query head i reads kv head i // (h / h_kv); nothing to do when
    h_kv = h); scaled scores, the position bias (relative, t5, alibi: bidirectional
    unless causal), an additive attn_mask [T, S] requiring grad (with `additive`), then
    -inf where causal, outside a sliding window (|i - j| >= window) or key padding (with
    `kpm`) masks a key; softmax, the values, out_proj."""
    pos = args.get("pos")
    causal = args.get("causal", 0) == 1
    params = dict(proj)
    if pos == "relative":
        params["relative_attention_bias.weight"] = rand(h, 2 * args["M"] + 1)
    elif pos == "t5":
        params["relative_attention_bias.weight"] = rand(h, args["buckets"])
    for p in params.values():
        p.requires_grad_(True)
    self_attn = args.get("self", 0) == 1
    t = inputs(B, T, S, E, self_attn)
    grads = list(t)
    x_q = t["query"]
    x_k, x_v = (x_q, x_q) if self_attn else (t["key"], t["value"])
    if "in_proj_weight" in params:
        Wq, Wk, Wv = params["in_proj_weight"].chunk(3)
        bq, bk, bv = params["in_proj_bias"].chunk(3)
    else:
        Wq, Wk, Wv = (params[n + "_proj_weight"] for n in "qkv")
        bq, bk, bv = params["in_proj_bias"].split([Wq.shape[0], Wk.shape[0], Wv.shape[0]])

    def heads(x, L):
        return x.reshape(B, L, -1, d).transpose(1, 2)

    q = heads(x_q @ Wq.T + bq, T)
    k = heads(x_k @ Wk.T + bk, S)
    v = heads(x_v @ Wv.T + bv, S)
    if pos == "rope":
        q, k = rope(q, args["base"]), rope(k, args["base"])
    if k.shape[1] != h:
        k = k.repeat_interleave(h // k.shape[1], dim=1)
        v = v.repeat_interleave(h // v.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    bias_args = dict(args, bidir=0 if causal else 1)
    bias = position_bias(bias_args, params.get("relative_attention_bias.weight"), h, T, S)
    if bias is not None:
        s = s + bias[None]
    if additive:
        t["mask"] = rand(T, S, lo=-2, hi=2).requires_grad_(True)
        grads.append("mask")
        s = s + t["mask"]
    masked = torch.zeros(B, 1, T, S, dtype=torch.bool)
    if causal:
        masked = masked | torch.ones(T, S, dtype=torch.bool).triu(1)
    if args.get("window"):
        i = torch.arange(T)[:, None]
        j = torch.arange(S)[None, :]
        masked = masked | ((i - j).abs() >= args["window"])
    if kpm:
        t["kpm"] = torch.rand(B, S) < 0.3
        t["kpm"][:, 0] = False
        if args.get("window"):  # every query keeps the key at its own position
            t["kpm"][:, :T] = False
        masked = masked | t["kpm"][:, None, None, :]
    w = torch.softmax(s.masked_fill(masked, float("-inf")), -1)
    ctx = (w @ v).transpose(1, 2).reshape(B, T, h * d)
    out = ctx @ params["out_proj.weight"].T + params["out_proj.bias"]
    return finish(t, out, params, grads)


def positions_case(args, B, T, S, E, h, kpm=False):
    """MultiheadAttention with a position scheme inside, written out."""
    proj = {"in_proj_weight": rand(3 * E, E, lo=-0.6, hi=0.6),
            "in_proj_bias": rand(3 * E, lo=-0.5, hi=0.5),
            "out_proj.weight": rand(E, E, lo=-0.6, hi=0.6),
            "out_proj.bias": rand(E, lo=-0.5, hi=0.5)}
    return written_case(args, B, T, S, E, h, E // h, proj, kpm)


def main():
    torch.manual_seed(20261125)
    tensors, meta = {}, {}
    n = 0

    def add(kind, args, t):
        nonlocal n
        meta["c%d.kind" % n] = kind
        meta["c%d.args" % n] = " ".join("%s=%s" % kv for kv in args.items())
        for name, value in t.items():
            tensors["c%d.%s" % (n, name)] = value
        n += 1

    A = dict
    B, h = 2, 2
    # The extra keys with causal and broadcast masks, bool in both polarities and additive.
    for extra in (A(bias_kv=1), A(zero_attn=1), A(bias_kv=1, zero_attn=1)):
        for shape in ((B, 1, 1, 6), (B, 1, 5, 6), (5, 6), (6,)):
            a = A(E=8, h=h, causal=1, **extra)
            add("masks", a, masks_case(a, B, 5, 6, 8, h, shape))
        a = A(E=8, h=h, causal=1, keeps=1, self=1, **extra)
        add("masks", a, masks_case(a, B, 5, 5, 8, h, (B, 1, 1, 5), kpm=True))
        a = A(E=8, h=h, causal=1, self=1, **extra)
        add("masks", a, masks_case(a, B, 5, 5, 8, h, (B, 1, 1, 5), additive=True))
        a = A(E=12, h=3, causal=1, **extra)
        add("masks", a, masks_case(a, B, 4, 6, 12, 3, (6,), additive=True, kpm=True))
    a = A(E=12, h=3, keeps=1, bias_kv=1)
    add("masks", a, masks_case(a, B, 4, 6, 12, 3, (1, 3, 4, 6), kpm=True))
    # Positions inside the attention, each scheme, causal and not, self and cross.
    a = A(E=8, h=2, pos="relative", M=3, self=1)
    add("positions", a, positions_case(a, B, 7, 7, 8, 2))
    a = A(E=12, h=3, pos="relative", M=2, causal=1)
    add("positions", a, positions_case(a, B, 5, 7, 12, 3, kpm=True))
    a = A(E=8, h=2, pos="t5", buckets=8, maxd=20, self=1)
    add("positions", a, positions_case(a, 1, 24, 24, 8, 2))
    a = A(E=12, h=3, pos="t5", buckets=6, maxd=16, causal=1, self=1)
    add("positions", a, positions_case(a, B, 20, 20, 12, 3, kpm=True))
    a = A(E=12, h=3, pos="alibi", self=1)
    add("positions", a, positions_case(a, B, 6, 6, 12, 3))
    a = A(E=16, h=4, pos="alibi", causal=1)
    add("positions", a, positions_case(a, B, 5, 7, 16, 4))
    a = A(E=8, h=2, pos="rope", base=10000.0, self=1, causal=1)
    add("positions", a, positions_case(a, B, 6, 6, 8, 2))
    a = A(E=12, h=2, pos="rope", base=500.0)
    add("positions", a, positions_case(a, B, 4, 7, 12, 2, kpm=True))
    meta["cases"] = str(n)
    meta["written_by"] = "torch " + torch.__version__
    sio.save(tensors, OUT, meta)
    print("wrote %d cases to %s" % (n, os.path.relpath(OUT, ROOT)))


if __name__ == "__main__":
    main()
