#!/usr/bin/python3
"""Writes tests/reference/compose_pytorch.safetensors: the source documents'
RelativeMultiHeadAttention (a learnable per-head bias table [h, 2M+1], indexed
by the relative position i - j clipped to [-M, M], added to the scores inside
the softmax) and the per-head attention entropy -sum(a * log(a + 1e-10)),
computed by PyTorch in float64, with the gradients of

    L = sum(out * g_out) + sum(entropy * g_ent)

with respect to every parameter and the input. tests/test_ops_compose.c builds
the same model from attograd's general ops only and compares.

Shapes: x [B, T, E]; w_q, w_k, w_v, w_o [E, E] (PyTorch's [out, in]); rel_bias
[h, 2M+1]; a causal mask (-inf above the diagonal); out [B, T, E];
entropy [B, h] (the mean over queries of each row's entropy).

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_compose_reference.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402

OUT = os.path.join(ROOT, "tests", "reference", "compose_pytorch.safetensors")
torch.manual_seed(20261123)
D = torch.float64
B, T, E, H, M = 2, 5, 8, 2, 2  # T > M + 1, so the clipping matters
d = E // H


def f32_exact(t):
    return t.float().double()


def rand(*shape, scale=1.0):
    return f32_exact((torch.rand(*shape, dtype=D) * 2 - 1) * scale)


def relative_positions(t, m):
    pos = torch.arange(t)
    return (pos[:, None] - pos[None, :]).clamp(-m, m) + m


def model(x, w_q, w_k, w_v, w_o, rel_bias):
    def heads(y):
        return y.reshape(B, T, H, d).transpose(1, 2)
    q, k, v = heads(x @ w_q.T), heads(x @ w_k.T), heads(x @ w_v.T)
    scores = q @ k.transpose(-1, -2) / d ** 0.5
    scores = scores + rel_bias[:, relative_positions(T, M)]  # [h, T, T] over [B, h, T, T]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    a = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)
    out = (a @ v).transpose(1, 2).reshape(B, T, E) @ w_o.T
    entropy = -(a * torch.log(a + 1e-10)).sum(-1).mean(-1)  # [B, h]
    return out, entropy


inputs = {"x": rand(B, T, E), "w_q": rand(E, E, scale=0.5), "w_k": rand(E, E, scale=0.5),
          "w_v": rand(E, E, scale=0.5), "w_o": rand(E, E, scale=0.5),
          "rel_bias": rand(H, 2 * M + 1)}
for t in inputs.values():
    t.requires_grad_(True)
out, entropy = model(**inputs)
g_out, g_ent = rand(B, T, E), rand(B, H)
((out * g_out).sum() + (entropy * g_ent).sum()).backward()

tensors = {f"in.{k}": v.detach() for k, v in inputs.items()}
tensors.update({f"grad.{k}": v.grad for k, v in inputs.items()})
tensors.update({"out": out.detach(), "entropy": entropy.detach(), "g_out": g_out,
                "g_ent": g_ent})
meta = {"B": str(B), "T": str(T), "E": str(E), "heads": str(H), "max_rel": str(M),
        "written_by": f"torch {torch.__version__}"}
sio.save(tensors, OUT, meta)
print(f"wrote {os.path.relpath(OUT, ROOT)}")
