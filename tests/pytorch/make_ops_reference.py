#!/usr/bin/python3
"""Writes tests/reference/ops_pytorch.safetensors: for every attograd op, a few
cases computed by PyTorch in float64 — inputs, an upstream gradient, the
output, and the gradient of every differentiable input.

tests/test_ops_pytorch.c replays each case through attograd in float64
(max |ours - torch| <= 1e-10 * max |torch|, per tensor) and in float32
(<= 1e-5 * max |torch|).

Every float input (and upstream gradient) is rounded to a value float32
represents exactly, so both runs start from identical numbers.

Layout: case i stores tensors "c<i>.in.<name>", "c<i>.grad_out", "c<i>.out"
and "c<i>.grad.<name>", and metadata "c<i>.op" (the op) and "c<i>.args"
(its arguments, "key=value" pairs separated by spaces); metadata "cases" is
the number of cases. Integer inputs (ids, targets) are I64, masks BOOL.

Where attograd's semantics differ from PyTorch's on purpose, the reference
encodes attograd's (documented) choice, computed with PyTorch ops:
- a softmax row whose keys are all masked is zeros with zero gradient
  (PyTorch: NaN);
- dropout's keep mask comes from pcg32 (reimplemented below from the
  published algorithm) by attograd's rule, and PyTorch computes
  x * keep / (1 - p) and its gradient.

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_ops_reference.py
"""
import math
import os
import re
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402

OUT = os.path.join(ROOT, "tests", "reference", "ops_pytorch.safetensors")
torch.manual_seed(20261121)
D = torch.float64


def rand(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(*shape, dtype=D) * (hi - lo) + lo)


# ---- pcg32, from the published algorithm (for the dropout mask) ----------------
MASK64 = (1 << 64) - 1
MULT = 6364136223846793005


class Pcg32:
    def __init__(self, initstate, initseq):
        self.state = 0
        self.inc = ((initseq << 1) | 1) & MASK64
        self.next()
        self.state = (self.state + initstate) & MASK64
        self.next()

    def next(self):
        old = self.state
        self.state = (old * MULT + self.inc) & MASK64
        xorshifted = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xorshifted >> rot) | (xorshifted << ((-rot) & 31))) & 0xFFFFFFFF

    def advance(self, delta):
        cur_mult, cur_plus, acc_mult, acc_plus = MULT, self.inc, 1, 0
        while delta > 0:
            if delta & 1:
                acc_mult = (acc_mult * cur_mult) & MASK64
                acc_plus = (acc_plus * cur_mult + cur_plus) & MASK64
            cur_plus = ((cur_mult + 1) * cur_plus) & MASK64
            cur_mult = (cur_mult * cur_mult) & MASK64
            delta >>= 1
        self.state = (acc_mult * self.state + acc_plus) & MASK64


def dropout_keep(shape, p, seed, site):
    """attograd's rule: element (r, c) of a [..., D] tensor is kept iff the
    pcg32 output at offset r*D + c of stream (seed, site) is >= round(p * 2^32)."""
    d = shape[-1]
    rows = math.prod(shape) // d
    threshold = round(p * 2.0**32)
    keep = torch.zeros(rows, d, dtype=torch.bool)
    for r in range(rows):
        g = Pcg32(seed, site)
        g.advance(r * d)
        for c in range(d):
            keep[r, c] = g.next() >= threshold
    return keep.reshape(shape)


# ---- Cases -------------------------------------------------------------------------
cases = []


def f32_exact(t):
    """Rounds a float64 tensor to values float32 represents exactly, so the
    float32 run starts from the very inputs the float64 reference used."""
    return t.float().double() if t.is_floating_point() else t


def case(op, args, inputs, fn, grad_names):
    """inputs: name -> tensor (float ones that require grad get gradients)."""
    inputs = {name: f32_exact(t) for name, t in inputs.items()}
    for name in grad_names:
        inputs[name] = inputs[name].clone().requires_grad_(True)
    out = fn(**inputs)
    grad_out = f32_exact(rand(*out.shape)) if out.dim() else torch.tensor(0.75, dtype=D)
    out.backward(grad_out)
    cases.append((op, args, inputs, grad_out, out.detach(), grad_names))


def add_cases():
    for sa, sb in [((2, 3, 4), (4,)), ((2, 3, 4), (3, 4)), ((3, 5), (3, 5)), ((3, 1), (4,)),
                   ((2, 1, 3, 4), (2, 3, 1, 1)), ((1, 1), (2, 2, 3)), ((4,), (2, 3, 4))]:
        case("add", "", {"a": rand(*sa), "b": rand(*sb)}, lambda a, b: a + b, ["a", "b"])
        case("sub", "", {"a": rand(*sa), "b": rand(*sb)}, lambda a, b: a - b, ["a", "b"])
        case("mul", "", {"a": rand(*sa), "b": rand(*sb)}, lambda a, b: a * b, ["a", "b"])
        case("div", "", {"a": rand(*sa), "b": rand(*sb, lo=0.5, hi=2.0)}, lambda a, b: a / b,
             ["a", "b"])
    case("scale", "s=-1.75", {"x": rand(2, 3)}, lambda x: -1.75 * x, ["x"])
    case("sum", "", {"x": rand(2, 3, 4)}, lambda x: x.sum(), ["x"])
    case("mean", "", {"x": rand(2, 3, 4)}, lambda x: x.mean(), ["x"])
    case("reshape", "shape=3,4", {"x": rand(2, 6)}, lambda x: x.reshape(3, 4), ["x"])


def activation_cases():
    x = rand(4, 7, lo=-3, hi=3)
    x = torch.where(x.abs() < 1e-2, x + 0.1, x)  # keep relu away from its kink
    case("relu", "", {"x": x}, lambda x: F.relu(x), ["x"])
    case("gelu", "kind=erf", {"x": rand(4, 7, lo=-4, hi=4)}, lambda x: F.gelu(x), ["x"])
    case("gelu", "kind=tanh", {"x": rand(4, 7, lo=-4, hi=4)},
         lambda x: F.gelu(x, approximate="tanh"), ["x"])


def linear_cases():
    case("linear", "", {"x": rand(2, 3, 5), "w": rand(4, 5), "b": rand(4)},
         lambda x, w, b: F.linear(x, w, b), ["x", "w", "b"])
    case("linear", "", {"x": rand(6, 5), "w": rand(3, 5)}, lambda x, w: F.linear(x, w), ["x", "w"])
    case("linear", "", {"x": rand(2, 2, 3, 4), "w": rand(5, 4), "b": rand(5)},
         lambda x, w, b: F.linear(x, w, b), ["x", "w", "b"])


def matmul_cases():
    M, K, N = 3, 5, 4
    for ta in (0, 1):
        for tb in (0, 1):
            a = rand(2, 3, *((K, M) if ta else (M, K)))
            b = rand(2, 3, *((N, K) if tb else (K, N)))

            def fn(a, b, ta=ta, tb=tb):
                return torch.matmul(a.transpose(-1, -2) if ta else a,
                                    b.transpose(-1, -2) if tb else b)
            case("matmul", f"ta={ta} tb={tb}", {"a": a, "b": b}, fn, ["a", "b"])
    case("matmul", "ta=0 tb=0", {"a": rand(4, 6), "b": rand(6, 2)},
         lambda a, b: a @ b, ["a", "b"])
    # broadcast leading dims
    case("matmul", "ta=0 tb=0", {"a": rand(2, 3, 4, 5), "b": rand(5, 6)},
         lambda a, b: a @ b, ["a", "b"])
    case("matmul", "ta=0 tb=0", {"a": rand(2, 1, 4, 5), "b": rand(1, 3, 5, 6)},
         lambda a, b: a @ b, ["a", "b"])
    case("matmul", "ta=1 tb=1", {"a": rand(3, 5, 4), "b": rand(2, 3, 6, 5)},
         lambda a, b: a.transpose(-1, -2) @ b.transpose(-1, -2), ["a", "b"])


def heads_cases():
    def split(x, h):
        B, T, E = x.shape
        return x.reshape(B, T, h, E // h).transpose(1, 2)

    case("split_heads", "heads=4", {"x": rand(2, 3, 12)}, lambda x: split(x, 4), ["x"])
    case("split_heads", "heads=1", {"x": rand(2, 1, 5)}, lambda x: split(x, 1), ["x"])
    case("merge_heads", "", {"x": rand(2, 4, 3, 3)},
         lambda x: x.transpose(1, 2).reshape(2, 3, 12), ["x"])


def softmax_reference(x, scale=1.0, mask=None, add=None, causal=False, kpm=None):
    """attograd's masked scaled softmax in PyTorch ops (x: [..., T, S])."""
    T, S = x.shape[-2], x.shape[-1]
    s = x * scale
    if add is not None:
        s = s + add.reshape(*([-1] if add.dim() == 3 else []), T, S).reshape(
            *(x.shape[:-2] if add.dim() == 3 else ()), T, S)
    masked = torch.zeros(x.shape, dtype=torch.bool)
    if mask is not None:
        masked = masked | mask.reshape(*(x.shape[:-2] if mask.dim() == 3 else ()), T, S)
    if causal:
        masked = masked | torch.ones(T, S, dtype=torch.bool).triu(1)
    if kpm is not None:
        B = x.shape[0]
        masked = masked | kpm.reshape(B, *([1] * (x.dim() - 2)), S)
    masked = masked | torch.isneginf(s.detach())
    empty = masked.all(-1, keepdim=True)
    s = s.masked_fill(masked, float("-inf")).masked_fill(empty, 0.0)
    return torch.softmax(s, -1).masked_fill(empty, 0.0)


def softmax_cases():
    B, h, T, S = 2, 3, 4, 5
    case("softmax", "scale=0.5", {"x": rand(B, h, T, S, lo=-3, hi=3)},
         lambda x: softmax_reference(x, 0.5), ["x"])
    case("softmax", "scale=1", {"x": rand(1, T)}, lambda x: softmax_reference(x), ["x"])
    m = torch.rand(T, S) < 0.3
    m[1, :] = True          # a fully masked row
    m[2, :] = True
    m[2, 3] = False         # a row with one key left
    case("softmax", "scale=0.7", {"x": rand(B, h, T, S), "mask": m},
         lambda x, mask: softmax_reference(x, 0.7, mask=mask), ["x"])
    case("softmax", "scale=1 causal=1", {"x": rand(B, h, T, S)},
         lambda x: softmax_reference(x, causal=True), ["x"])
    case("softmax", "scale=1 causal=1", {"x": rand(B, h, 1, S)},
         lambda x: softmax_reference(x, causal=True), ["x"])
    add = rand(B * h, T, S)
    add[0, 2, :] = float("-inf")  # a row masked by the additive mask alone
    add[1, 0, 1] = float("-inf")
    case("softmax", "scale=0.25", {"x": rand(B, h, T, S), "additive_mask": add},
         lambda x, additive_mask: softmax_reference(x, 0.25, add=additive_mask),
         ["x", "additive_mask"])
    kpm = torch.tensor([[False, False, True, False, True], [True, True, True, True, True]])
    case("softmax", "scale=1", {"x": rand(B, h, T, S), "key_padding_mask": kpm},
         lambda x, key_padding_mask: softmax_reference(x, kpm=key_padding_mask), ["x"])
    kpm2 = torch.tensor([[False, False, False, True, True], [False, True, False, False, False]])
    case("softmax", "scale=0.5 causal=1",
         {"x": rand(B, h, T, S), "mask": torch.rand(B * h, T, S) < 0.2,
          "additive_mask": rand(T, S), "key_padding_mask": kpm2},
         lambda x, mask, additive_mask, key_padding_mask: softmax_reference(
             x, 0.5, mask=mask, add=additive_mask, causal=True, kpm=key_padding_mask), ["x"])


def dropout_cases():
    for shape, p, seed, site in [((4, 6), 0.25, 1234, 7), ((2, 3, 9), 0.1, 99, 3)]:
        keep = dropout_keep(shape, p, seed, site)
        case("dropout", f"p={p} seed={seed} site={site}", {"x": rand(*shape)},
             lambda x, keep=keep, p=p: x * keep / (1 - p), ["x"])


def layernorm_cases():
    case("layernorm", "eps=1e-05", {"x": rand(2, 3, 8, lo=-2, hi=3), "w": rand(8), "b": rand(8)},
         lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), ["x", "w", "b"])
    case("layernorm", "eps=1e-05", {"x": rand(4, 6)},
         lambda x: F.layer_norm(x, (6,), None, None, 1e-5), ["x"])
    case("layernorm", "eps=1e-05",
         {"x": 100 + 1e-3 * rand(3, 5), "w": rand(5), "b": rand(5)},
         lambda x, w, b: F.layer_norm(x, (5,), w, b, 1e-5), ["x", "w", "b"])


def embedding_and_loss_cases():
    ids = torch.tensor([[3, 0, 3], [6, 1, 3]])
    case("embedding", "", {"weight": rand(7, 4), "ids": ids},
         lambda weight, ids: F.embedding(ids, weight), ["weight"])
    targets = torch.tensor([[1, -100, 4], [0, 2, 2]])
    case("cross_entropy", "ignore_index=-100", {"logits": rand(2, 3, 5, lo=-4, hi=4),
                                                 "targets": targets},
         lambda logits, targets: F.cross_entropy(logits.reshape(-1, 5), targets.reshape(-1),
                                                 ignore_index=-100), ["logits"])
    case("cross_entropy", "ignore_index=2", {"logits": rand(4, 3), "targets": torch.tensor([0, 2, 1, 1])},
         lambda logits, targets: F.cross_entropy(logits, targets, ignore_index=2), ["logits"])
    case("mse", "", {"x": rand(3, 4), "target": rand(3, 4)},
         lambda x, target: F.mse_loss(x, target), ["x", "target"])


def shape_cases():
    case("transpose", "d0=0 d1=-1", {"x": rand(2, 3, 4)}, lambda x: x.transpose(0, -1), ["x"])
    case("transpose", "d0=1 d1=2", {"x": rand(2, 3, 1, 4)}, lambda x: x.transpose(1, 2), ["x"])
    case("permute", "perm=2,0,3,1", {"x": rand(2, 3, 4, 5)}, lambda x: x.permute(2, 0, 3, 1),
         ["x"])
    case("slice", "dim=1 start=-3 length=2", {"x": rand(2, 5, 3)},
         lambda x: x.narrow(1, 2, 2), ["x"])
    case("slice", "dim=0 start=1 length=1", {"x": rand(3, 4)}, lambda x: x.narrow(0, 1, 1), ["x"])
    case("concat", "dim=1", {"x0": rand(2, 1, 3), "x1": rand(2, 4, 3), "x2": rand(2, 2, 3)},
         lambda x0, x1, x2: torch.cat([x0, x1, x2], 1), ["x0", "x1", "x2"])
    case("concat", "dim=-1", {"x0": rand(3, 2), "x1": rand(3, 5)},
         lambda x0, x1: torch.cat([x0, x1], -1), ["x0", "x1"])
    case("stack", "dim=-1", {"x0": rand(2, 3), "x1": rand(2, 3), "x2": rand(2, 3)},
         lambda x0, x1, x2: torch.stack([x0, x1, x2], -1), ["x0", "x1", "x2"])
    case("stack", "dim=0", {"x0": rand(4), "x1": rand(4)},
         lambda x0, x1: torch.stack([x0, x1], 0), ["x0", "x1"])
    case("expand", "shape=2,-1,4", {"x": rand(3, 1)}, lambda x: x.expand(2, -1, 4), ["x"])
    case("expand", "shape=3,2,2", {"x": rand(1, 2, 1)}, lambda x: x.expand(3, 2, 2), ["x"])
    idx = torch.tensor([3, 0, 3, 1, 2])
    case("index_select", "dim=1", {"x": rand(2, 4, 3), "index": idx},
         lambda x, index: x.index_select(1, index), ["x"])
    case("index_select", "dim=-1", {"x": rand(2, 4), "index": torch.tensor([1, 1])},
         lambda x, index: x.index_select(-1, index), ["x"])
    gidx = torch.randint(0, 4, (2, 3, 2))
    case("gather", "dim=-1", {"x": rand(2, 3, 4), "index": gidx},
         lambda x, index: x.gather(-1, index), ["x"])
    case("gather", "dim=0", {"x": rand(3, 4), "index": torch.randint(0, 3, (5, 4))},
         lambda x, index: x.gather(0, index), ["x"])


def select_cases():
    cond = torch.rand(2, 1, 4) < 0.5
    case("where", "", {"cond": cond, "a": rand(3, 4), "b": rand(2, 3, 1)},
         lambda cond, a, b: torch.where(cond, a, b), ["a", "b"])
    mask = torch.rand(2, 1, 3, 5) < 0.4
    mask[0, 0, 1, :] = True  # a fully masked row
    case("masked_fill", "value=0.5", {"x": rand(2, 4, 3, 5), "mask": mask},
         lambda x, mask: x.masked_fill(mask, 0.5), ["x"])
    case("masked_fill", "value=-inf", {"x": rand(3, 5), "mask": torch.rand(3, 5) < 0.4},
         lambda x, mask: x.masked_fill(mask, float("-inf")), ["x"])


def away_from_zero(x, gap=0.05):
    return torch.where(x.abs() < gap, x + 2 * gap, x)


def elementwise_cases():
    case("neg", "", {"x": rand(3, 4)}, lambda x: -x, ["x"])
    case("exp", "", {"x": rand(3, 4, lo=-3, hi=3)}, lambda x: torch.exp(x), ["x"])
    case("log", "", {"x": rand(3, 4, lo=0.1, hi=4)}, lambda x: torch.log(x), ["x"])
    case("sqrt", "", {"x": rand(3, 4, lo=0.1, hi=4)}, lambda x: torch.sqrt(x), ["x"])
    case("pow", "p=2", {"x": rand(3, 4, lo=-2, hi=2)}, lambda x: x.pow(2), ["x"])
    case("pow", "p=3", {"x": rand(2, 5, lo=-2, hi=2)}, lambda x: x.pow(3), ["x"])
    case("pow", "p=-1.5", {"x": rand(3, 4, lo=0.2, hi=3)}, lambda x: x.pow(-1.5), ["x"])
    case("pow", "p=0.5", {"x": rand(3, 4, lo=0.2, hi=3)}, lambda x: x.pow(0.5), ["x"])
    case("abs", "", {"x": away_from_zero(rand(3, 4))}, lambda x: torch.abs(x), ["x"])
    x = rand(4, 5, lo=-2, hi=2)
    x = torch.where((x - 0.5).abs() < 0.05, x + 0.1, x)
    x = torch.where((x + 0.5).abs() < 0.05, x + 0.1, x)
    case("clamp", "lo=-0.5 hi=0.5", {"x": x}, lambda x: x.clamp(-0.5, 0.5), ["x"])
    case("clamp", "lo=-inf hi=0.5", {"x": x}, lambda x: x.clamp(max=0.5), ["x"])
    case("sigmoid", "", {"x": rand(3, 4, lo=-6, hi=6)}, lambda x: torch.sigmoid(x), ["x"])
    case("tanh", "", {"x": rand(3, 4, lo=-3, hi=3)}, lambda x: torch.tanh(x), ["x"])
    case("silu", "", {"x": rand(3, 4, lo=-6, hi=6)}, lambda x: F.silu(x), ["x"])


def reduction_cases():
    case("sum_dim", "dim=1 keepdim=0", {"x": rand(2, 3, 4)}, lambda x: x.sum(1), ["x"])
    case("sum_dim", "dim=-1 keepdim=1", {"x": rand(2, 3, 4)}, lambda x: x.sum(-1, keepdim=True),
         ["x"])
    case("mean_dim", "dim=0 keepdim=0", {"x": rand(3, 5)}, lambda x: x.mean(0), ["x"])
    case("mean_dim", "dim=-2 keepdim=1", {"x": rand(2, 3, 4, 2)},
         lambda x: x.mean(-2, keepdim=True), ["x"])
    case("max_dim", "dim=-1 keepdim=0", {"x": rand(3, 5)}, lambda x: x.max(-1)[0], ["x"])
    ties = torch.randint(0, 3, (3, 4, 2)).double()
    case("max_dim", "dim=1 keepdim=1", {"x": ties}, lambda x: x.max(1, keepdim=True)[0], ["x"])
    case("var_dim", "dim=1 unbiased=1 keepdim=0", {"x": rand(2, 5, 3)},
         lambda x: x.var(1, unbiased=True), ["x"])
    case("var_dim", "dim=-1 unbiased=0 keepdim=1", {"x": rand(4, 6)},
         lambda x: x.var(-1, unbiased=False, keepdim=True), ["x"])
    x = rand(3, 5, lo=-3, hi=3)
    x[1, 2] = float("-inf")
    case("logsumexp", "dim=-1 keepdim=0", {"x": x}, lambda x: torch.logsumexp(x, -1), ["x"])
    case("logsumexp", "dim=0 keepdim=1", {"x": rand(4, 3, lo=-3, hi=3)},
         lambda x: torch.logsumexp(x, 0, keepdim=True), ["x"])
    case("softmax_dim", "dim=1", {"x": rand(2, 4, 3, lo=-3, hi=3)},
         lambda x: torch.softmax(x, 1), ["x"])
    case("softmax_dim", "dim=-1", {"x": x}, lambda x: torch.softmax(x, -1), ["x"])
    case("log_softmax", "dim=-1", {"x": rand(3, 5, lo=-3, hi=3)},
         lambda x: torch.log_softmax(x, -1), ["x"])
    case("log_softmax", "dim=0", {"x": rand(4, 2, 3, lo=-3, hi=3)},
         lambda x: torch.log_softmax(x, 0), ["x"])


def rms_norm(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def norm_and_loss_cases():
    case("rmsnorm", "eps=1e-06", {"x": rand(2, 3, 8, lo=-2, hi=2), "w": rand(8, lo=0.5, hi=1.5)},
         lambda x, w: rms_norm(x, w, 1e-6), ["x", "w"])
    case("rmsnorm", "eps=1e-05", {"x": rand(4, 5, lo=-2, hi=2)},
         lambda x: rms_norm(x, None, 1e-5), ["x"])
    logp = torch.log_softmax(rand(2, 3, 5, lo=-3, hi=3), -1)
    targets = torch.tensor([[1, -100, 4], [0, 2, 2]])
    case("nll_loss", "ignore_index=-100", {"logp": logp, "targets": targets},
         lambda logp, targets: F.nll_loss(logp.reshape(-1, 5), targets.reshape(-1),
                                          ignore_index=-100), ["logp"])
    case("bce_with_logits", "", {"x": rand(3, 4, lo=-5, hi=5), "target": rand(3, 4, lo=0, hi=1)},
         lambda x, target: F.binary_cross_entropy_with_logits(x, target), ["x", "target"])
    case("bce_with_logits", "", {"x": rand(6, lo=-30, hi=30), "target": (rand(6) > 0).double()},
         lambda x, target: F.binary_cross_entropy_with_logits(x, target), ["x"])


def attention_cases():
    B, h, T, S, d = 2, 2, 3, 5, 4
    case("attention", "scale=0.5",
         {"q": rand(B, h, T, d), "k": rand(B, h, S, d), "v": rand(B, h, S, 3)},
         lambda q, k, v: softmax_reference(q @ k.transpose(-1, -2), 0.5) @ v, ["q", "k", "v"])
    case("attention", "scale=0.5 causal=1 heads=2",
         {"q": rand(B, T, h * d), "k": rand(B, S, h * d), "v": rand(B, S, h * 3)},
         lambda q, k, v: (softmax_reference(
             q.reshape(B, T, h, d).transpose(1, 2) @ k.reshape(B, S, h, d).transpose(1, 2)
             .transpose(-1, -2), 0.5, causal=True) @ v.reshape(B, S, h, 3).transpose(1, 2))
         .transpose(1, 2).reshape(B, T, h * 3), ["q", "k", "v"])
    E = h * d

    def packed(qkv):
        q, k, v = (qkv[..., i * E:(i + 1) * E].reshape(B, T, h, d).transpose(1, 2)
                   for i in range(3))
        out = softmax_reference(q @ k.transpose(-1, -2), 0.5, causal=True) @ v
        return out.transpose(1, 2).reshape(B, T, E)
    case("attention_packed", "scale=0.5 causal=1 heads=2", {"qkv": rand(B, T, 3 * E)}, packed,
         ["qkv"])


def rope_reference(x, heads=0, base=10000.0, offset=0):
    """Rotary embedding, rotate_half convention (HuggingFace LLaMA, GPT-NeoX)."""
    if heads:
        B, T, E = x.shape
        x = x.reshape(B, T, heads, E // heads).transpose(1, 2)
    T, d = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d // 2, dtype=D) * 2 / d)
    angle = (offset + torch.arange(T, dtype=D))[:, None] * inv[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    y = x * cos + torch.cat([-x2, x1], -1) * sin
    return y.transpose(1, 2).reshape(y.shape[0], T, -1) if heads else y


def rope_cases():
    case("rope", "base=10000 offset=0 heads=0", {"x": rand(2, 3, 5, 8)},
         lambda x: rope_reference(x), ["x"])
    case("rope", "base=100 offset=7 heads=2", {"x": rand(2, 4, 12)},
         lambda x: rope_reference(x, heads=2, base=100.0, offset=7), ["x"])
    case("rope", "base=10000 offset=3 heads=0", {"x": rand(1, 1, 1, 2)},
         lambda x: rope_reference(x, offset=3), ["x"])


def head_mask_cases():
    case("head_mask", "heads=0", {"x": rand(2, 3, 4, 5), "mask": rand(3)},
         lambda x, mask: x * mask[None, :, None, None], ["x", "mask"])
    def inside(x, mask, h=2):
        B, T, E = x.shape
        return (x.reshape(B, T, h, E // h) * mask[:, None]).reshape(B, T, E)
    case("head_mask", "heads=2", {"x": rand(2, 3, 8), "mask": rand(2)}, inside, ["x", "mask"])


add_cases()
shape_cases()
select_cases()
elementwise_cases()
reduction_cases()
norm_and_loss_cases()
activation_cases()
linear_cases()
matmul_cases()
heads_cases()
softmax_cases()
dropout_cases()
layernorm_cases()
embedding_and_loss_cases()
attention_cases()
rope_cases()
head_mask_cases()

# Every op of the registry (src/ops/registry.h, the one list of ops) has a case, and every
# case is of an op of the registry: otherwise nothing is written.
def registry_ops():
    with open(os.path.join(ROOT, "src", "ops", "registry.h")) as f:
        text = f.read()
    body = text[text.index("#define AGI_OPS(X)"):]
    return re.findall(r"^\s*X\((\w+),", body, re.M)


ops, covered = registry_ops(), {c[0] for c in cases}
missing, unknown = [o for o in ops if o not in covered], sorted(covered - set(ops))
if missing or unknown or len(ops) < 54:
    sys.exit(f"make_ops_reference: ops without a case: {missing}; cases of ops not in "
             f"src/ops/registry.h: {unknown} ({len(ops)} ops read from the registry)")

tensors, meta = {}, {"cases": str(len(cases)), "written_by": f"torch {torch.__version__}"}
for i, (op, args, inputs, grad_out, out, grad_names) in enumerate(cases):
    meta[f"c{i}.op"] = op
    meta[f"c{i}.args"] = args
    for name, t in inputs.items():
        tensors[f"c{i}.in.{name}"] = t.detach()
    tensors[f"c{i}.grad_out"] = grad_out
    tensors[f"c{i}.out"] = out
    for name in grad_names:
        tensors[f"c{i}.grad.{name}"] = inputs[name].grad
sio.save(tensors, OUT, meta)
print(f"wrote {len(cases)} cases to {os.path.relpath(OUT, ROOT)}")
