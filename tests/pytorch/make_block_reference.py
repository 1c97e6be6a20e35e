#!/usr/bin/python3
"""Writes tests/reference/block_pytorch.safetensors: torch.nn.TransformerEncoderLayer
(batch_first=True, dropout 0) cases in float64 — the layer's state_dict, an
input, an upstream gradient, the output, and the gradients of the input and
of every parameter. tests/test_block_pytorch.c loads each state_dict into an
ag_block and compares (per tensor, max |ours - torch| <= 1e-10 * max |torch|).

Layout: case i stores "c<i>.param.<state_dict name>", "c<i>.x", "c<i>.grad_out",
"c<i>.out", "c<i>.grad.x", "c<i>.grad.<state_dict name>", optionally
"c<i>.key_padding_mask", and metadata "c<i>.config" ("key=value" pairs);
metadata "cases" is the number of cases. Inputs are float32-exact.

Configurations beyond torch 1.13's constructor:
- bias=0 is TransformerEncoderLayer(bias=False) of torch >= 2.1 (no bias in the
  linears, the LayerNorms or the attention). torch 1.13 has no such option, so the
  layer is built with biases, every bias is set to zero and frozen, and only the
  weights are stored: the function, and every gradient stored, are bias=False's.
- bias_kv=1 / zero_attn=1 replace self_attn by a MultiheadAttention with
  add_bias_kv / add_zero_attn (its parameters self_attn.bias_k, self_attn.bias_v).
- keeps=1 stores the key padding mask inverted (true = may attend), as the block
  takes it with mask_polarity = AG_MASK_KEEPS; torch gets it as true = padding.

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_block_reference.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402

OUT = os.path.join(ROOT, "tests", "reference", "block_pytorch.safetensors")
torch.manual_seed(7)
D = torch.float64


def f32_exact(t):
    return t.float().double()


tensors, meta = {}, {}
configs = [
    dict(d_model=8, nhead=2, ff=16, act="relu", norm_first=0, causal=0, kpm=0, B=2, T=5),
    dict(d_model=8, nhead=4, ff=12, act="gelu", norm_first=1, causal=0, kpm=0, B=3, T=4),
    dict(d_model=6, nhead=3, ff=10, act="relu", norm_first=0, causal=1, kpm=0, B=2, T=6),
    dict(d_model=8, nhead=1, ff=8, act="gelu", norm_first=1, causal=1, kpm=1, B=2, T=5),
    dict(d_model=12, nhead=4, ff=20, act="relu", norm_first=0, causal=0, kpm=1, B=2, T=1),
    dict(d_model=8, nhead=2, ff=12, act="relu", norm_first=0, causal=1, kpm=1, B=2, T=5, bias=0),
    dict(d_model=12, nhead=3, ff=16, act="gelu", norm_first=1, causal=0, kpm=0, B=2, T=4, bias=0),
    dict(d_model=8, nhead=2, ff=12, act="relu", norm_first=1, causal=1, kpm=1, B=2, T=5,
         bias_kv=1, zero_attn=1, keeps=1),
]
for i, c in enumerate(configs):
    layer = torch.nn.TransformerEncoderLayer(c["d_model"], c["nhead"], c["ff"], dropout=0.0,
                                             activation=c["act"], batch_first=True,
                                             norm_first=bool(c["norm_first"])).double()
    if c.get("bias_kv") or c.get("zero_attn"):
        layer.self_attn = torch.nn.MultiheadAttention(
            c["d_model"], c["nhead"], dropout=0.0, batch_first=True, dtype=D,
            add_bias_kv=bool(c.get("bias_kv")), add_zero_attn=bool(c.get("zero_attn")))
    with torch.no_grad():  # move every parameter off its special init values
        for p in layer.parameters():
            p.copy_(f32_exact(torch.rand_like(p) * 1.4 - 0.7))
    no_bias = c.get("bias", 1) == 0
    if no_bias:  # bias=False: every bias zero, frozen, and left out of the file
        with torch.no_grad():
            for name, p in layer.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                    p.requires_grad_(False)
    x = f32_exact(torch.rand(c["B"], c["T"], c["d_model"], dtype=D) * 2 - 1).requires_grad_(True)
    mask = torch.ones(c["T"], c["T"], dtype=torch.bool).triu(1) if c["causal"] else None
    kpm = None
    if c["kpm"]:
        # Never pad every key of a sequence: PyTorch gives NaN there (attograd
        # gives zeros, by design), which cannot be compared.
        kpm = torch.zeros(c["B"], c["T"], dtype=torch.bool)
        if c["T"] > 1:
            kpm[0, -1] = True
        if c["T"] > 2:
            kpm[1, 1] = True
    out = layer(x, src_mask=mask, src_key_padding_mask=kpm)
    grad_out = f32_exact(torch.rand_like(out) * 2 - 1)
    out.backward(grad_out)
    meta[f"c{i}.config"] = " ".join(f"{k}={v}" for k, v in c.items())
    for name, p in layer.state_dict().items():
        if not (no_bias and name.endswith("bias")):
            tensors[f"c{i}.param.{name}"] = p
    for name, p in layer.named_parameters():
        if p.requires_grad:
            tensors[f"c{i}.grad.{name}"] = p.grad
    tensors[f"c{i}.x"] = x.detach()
    tensors[f"c{i}.grad_out"] = grad_out
    tensors[f"c{i}.out"] = out.detach()
    tensors[f"c{i}.grad.x"] = x.grad
    if kpm is not None:
        tensors[f"c{i}.key_padding_mask"] = ~kpm if c.get("keeps") else kpm
meta["cases"] = str(len(configs))
meta["written_by"] = f"torch {torch.__version__}"
sio.save(tensors, OUT, meta)
print(f"wrote {len(configs)} cases to {os.path.relpath(OUT, ROOT)}")
