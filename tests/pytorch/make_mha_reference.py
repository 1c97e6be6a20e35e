#!/usr/bin/python3
"""Writes the PyTorch references for the attograd-mha tool: for each case,
tests/reference/mha/<case>.in.safetensors (what the tool reads) and
tests/reference/mha/<case>.out.safetensors (what torch 1.13 computes for it).

Each case is one torch.nn.MultiheadAttention(batch_first=True) in eval mode
(no dropout) with random parameters (biases randomised too, since PyTorch
initialises them to zero), and random query, key, value and grad_output.

IN  holds the module's state_dict under its own names (in_proj_weight or
    q/k/v_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias; the
    biases are absent for bias=False), query, key, value, grad_output, the
    optional key_padding_mask and attn_mask, bias_k and bias_v with
    add_bias_kv, and metadata num_heads, causal and add_zero_attn.
OUT holds output and attn_weights (need_weights=True, averaged over heads)
    and the gradients of output.backward(grad_output): grad.query, grad.key,
    grad.value and grad.<name> for every parameter. query, key and value are
    always three distinct leaf tensors, so each has its own gradient (PyTorch
    would sum them into one tensor passed as both key and value).

Precision. A case named *_f64 stores F64 tensors, and OUT is torch's float64
result. A case named *_f32 stores F32 tensors; its OUT is torch's FLOAT64
result for exactly those float32 values, rounded to F32: the true answer to
float32 precision, so the test measures attograd's float32 error alone. (The
script prints how far torch's own float32 run is from it, for comparison.)
The _f32 case of a configuration has the same parameters and inputs as its
_f64 twin, rounded to float32.

Where PyTorch 1.13 has no direct way to say what the tool takes:
- causal=1: torch 1.13 has no is_causal, so torch gets the equivalent mask
  torch.ones(T, S, dtype=torch.bool).triu(1), or'ed into a bool attn_mask or
  filled into a float one as -inf;
- a U8 key_padding_mask: this torch build refuses one, so torch gets
  mask.bool() (nonzero = padding, as older PyTorch converted it). A U8
  attn_mask torch still takes (and converts the same way).
No case has a query whose keys are all masked: torch gives NaN there,
attograd zeros (a C test covers that on its own); the script asserts it.

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_mha_reference.py
"""
import copy
import os
import sys
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402

OUT_DIR = os.path.join(ROOT, "tests", "reference", "mha")
D = torch.float64


def uniform(*shape, lo=-1.0, hi=1.0):
    return torch.rand(*shape, dtype=D) * (hi - lo) + lo


def flags(*shape, p):
    return torch.rand(*shape) < p


def make_attn_mask(kind, B, h, T, S):
    """kind: bool, u8, float, bool3d, float3d. Key 0 is never masked, so with
    causal masking (which always allows key 0) no row is fully masked."""
    lead = (B * h,) if kind.endswith("3d") else ()
    if kind.startswith("float"):
        m = uniform(*lead, T, S, lo=-2, hi=2)
        m[..., T - 1, S - 1] = float("-inf")  # -inf is a mask too
        m[..., 0] = m[..., 0].clamp(min=-1)
        return m
    m = flags(*lead, T, S, p=0.3)
    m[..., 0] = False
    if kind == "u8":  # any nonzero byte means masked
        values = torch.tensor([1, 3, 255], dtype=torch.uint8)
        return m.to(torch.uint8) * values[torch.randint(0, 3, m.shape)]
    return m


def make_key_padding_mask(kind, B, S):
    m = flags(B, S, p=0.35)
    m[:, 0] = False
    m[-1, S // 2:] = True  # the last sequence is padded from the middle
    m[-1, 0] = False
    if kind == "u8":
        values = torch.tensor([1, 7, 255], dtype=torch.uint8)
        return m.to(torch.uint8) * values[torch.randint(0, 3, m.shape)]
    return m


def torch_masks(kpm, attn_mask, causal, T, S):
    """The masks torch 1.13 takes for what the tool reads."""
    if kpm is not None and kpm.dtype == torch.uint8:
        kpm = kpm.bool()
    if causal:
        tri = torch.ones(T, S, dtype=torch.bool).triu(1)
        if attn_mask is None:
            attn_mask = tri
        elif attn_mask.is_floating_point():
            attn_mask = attn_mask.masked_fill(tri, float("-inf"))
        else:
            attn_mask = attn_mask.bool() | tri
    return kpm, attn_mask


def assert_no_fully_masked_row(kpm, attn_mask, B, h, T, S):
    allowed = torch.ones(B, h, T, S, dtype=torch.bool)
    if kpm is not None:
        allowed &= ~kpm.reshape(B, 1, 1, S)
    if attn_mask is not None:
        masked = torch.isneginf(attn_mask) if attn_mask.is_floating_point() else attn_mask.bool()
        allowed &= ~masked.reshape(-1, h, T, S) if masked.dim() == 3 else ~masked
    assert allowed.any(-1).all(), "a query row has every key masked"


def run_torch(mha, inputs, kpm, attn_mask):
    """output, weights and every gradient, as {name: tensor}."""
    q, k, v = (inputs[n].clone().requires_grad_(True) for n in ("query", "key", "value"))
    mha.zero_grad(set_to_none=True)
    out, weights = mha(q, k, v, key_padding_mask=kpm, need_weights=True, attn_mask=attn_mask,
                       average_attn_weights=True)
    out.backward(inputs["grad_output"])
    result = {"output": out.detach(), "attn_weights": weights.detach(),
              "grad.query": q.grad, "grad.key": k.grad, "grad.value": v.grad}
    for name, p in mha.named_parameters():
        result[f"grad.{name}"] = p.grad
    return result


def rel_err(a, b):
    scale = b.abs().max().item()
    diff = (a.double() - b.double()).abs().max().item()
    return diff / scale if scale > 0 else diff


def make_case(name, *, B, T, S, E, h, kdim=None, vdim=None, bias=True, kpm=None,
              attn_mask=None, causal=False, add_bias_kv=False, add_zero_attn=False,
              dtypes=("f64",)):
    """Writes <name>_<dtype> for each dtype, all from the same float64 draw."""
    torch.manual_seed(zlib.crc32(name.encode()))
    mha = torch.nn.MultiheadAttention(E, h, bias=bias, kdim=kdim, vdim=vdim, batch_first=True,
                                      add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                                      dtype=D).eval()
    with torch.no_grad():
        for pname, p in mha.named_parameters():
            if pname.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    kd, vd = kdim or E, vdim or E
    inputs = {"query": uniform(B, T, E, lo=-1.5, hi=1.5), "key": uniform(B, S, kd, lo=-1.5, hi=1.5),
              "value": uniform(B, S, vd, lo=-1.5, hi=1.5), "grad_output": uniform(B, T, E)}
    kpm_in = make_key_padding_mask(kpm, B, S) if kpm else None
    am_in = make_attn_mask(attn_mask, B, h, T, S) if attn_mask else None
    kpm_t, am_t = torch_masks(kpm_in, am_in, causal, T, S)
    assert_no_fully_masked_row(kpm_t, am_t, B, h, T, S)

    for dt in dtypes:
        m = copy.deepcopy(mha)
        ins = dict(inputs)
        am_run = am_t
        if dt == "f32":  # the float32 values, computed on in float64
            with torch.no_grad():
                for p in m.parameters():
                    p.copy_(p.float().double())
            ins = {n: t.float().double() for n, t in ins.items()}
            if am_run is not None and am_run.is_floating_point():
                am_run = am_run.float().double()
        ref = run_torch(m, ins, kpm_t, am_run)
        for n, t in ref.items():
            assert torch.isfinite(t).all(), f"{name}: {n} is not finite"

        store = (lambda t: t.float()) if dt == "f32" else (lambda t: t)
        tensors = {n: store(t.detach()) for n, t in m.state_dict().items()}
        tensors.update({n: store(t) for n, t in ins.items()})
        if kpm_in is not None:
            tensors["key_padding_mask"] = kpm_in
        if am_in is not None:
            tensors["attn_mask"] = store(am_in) if am_in.is_floating_point() else am_in
        meta = {"num_heads": str(h)}
        if causal:
            meta["causal"] = "1"
        if add_zero_attn:
            meta["add_zero_attn"] = "1"
        case_name = f"{name}_{dt}"
        sio.save(tensors, os.path.join(OUT_DIR, f"{case_name}.in.safetensors"), meta)
        sio.save({n: store(t) for n, t in ref.items()},
                 os.path.join(OUT_DIR, f"{case_name}.out.safetensors"),
                 {"written_by": f"torch {torch.__version__}"})

        note = ""
        if dt == "f32":  # how far torch's own float32 run is from the reference
            m32 = copy.deepcopy(m).float()
            ins32 = {n: t.float() for n, t in ins.items()}
            am32 = am_run.float() if am_run is not None and am_run.is_floating_point() else am_run
            r32 = run_torch(m32, ins32, kpm_t, am32)
            note = f"  (torch float32 vs it: {max(rel_err(r32[n], ref[n]) for n in ref):.1e})"
        print(f"{case_name}: {len(ref)} tensors{note}")


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    # Plain configurations.
    make_case("self_packed", B=2, T=5, S=5, E=8, h=2, dtypes=("f64", "f32"))
    make_case("cross", B=2, T=3, S=7, E=12, h=3, dtypes=("f64", "f32"))
    make_case("kdim_vdim", B=2, T=4, S=3, E=8, h=2, kdim=5, vdim=7, dtypes=("f64", "f32"))
    make_case("no_bias", B=2, T=4, S=6, E=8, h=4, bias=False)
    make_case("no_bias_kdim", B=2, T=3, S=4, E=6, h=2, kdim=4, vdim=6, bias=False)
    make_case("one_head", B=3, T=4, S=5, E=6, h=1)
    make_case("one_query", B=2, T=1, S=6, E=8, h=2)
    make_case("head_dim_3", B=2, T=5, S=4, E=15, h=5)
    make_case("head_dim_10", B=1, T=6, S=9, E=20, h=2)
    make_case("larger", B=2, T=13, S=19, E=32, h=4, kpm="bool")
    # Masks.
    make_case("key_padding_bool", B=3, T=4, S=6, E=8, h=2, kpm="bool")
    make_case("key_padding_u8", B=3, T=4, S=6, E=8, h=2, kpm="u8")
    make_case("attn_mask_bool", B=2, T=5, S=6, E=8, h=2, attn_mask="bool")
    make_case("attn_mask_u8", B=2, T=5, S=6, E=8, h=2, attn_mask="u8")
    make_case("attn_mask_float", B=2, T=5, S=6, E=8, h=2, attn_mask="float")
    make_case("attn_mask_bool_3d", B=2, T=4, S=5, E=9, h=3, attn_mask="bool3d")
    make_case("attn_mask_float_3d", B=2, T=4, S=5, E=9, h=3, attn_mask="float3d")
    make_case("causal", B=2, T=6, S=6, E=8, h=2, causal=True, dtypes=("f64", "f32"))
    make_case("causal_cross", B=2, T=4, S=7, E=8, h=2, causal=True)
    # Everything at once.
    make_case("combined", B=2, T=5, S=6, E=12, h=3, kdim=7, vdim=4, kpm="bool",
              attn_mask="float", causal=True, dtypes=("f64", "f32"))
    make_case("combined_packed", B=2, T=6, S=6, E=16, h=4, bias=False, kpm="u8",
              attn_mask="bool3d", causal=True)
    # add_bias_kv and add_zero_attn: one or two more keys, the masks padded by PyTorch.
    make_case("bias_kv", B=2, T=4, S=5, E=8, h=2, add_bias_kv=True, dtypes=("f64", "f32"))
    make_case("zero_attn", B=2, T=4, S=5, E=8, h=2, add_zero_attn=True, kpm="bool")
    make_case("bias_kv_zero_attn_causal", B=2, T=5, S=5, E=12, h=3, add_bias_kv=True,
              add_zero_attn=True, causal=True)
    make_case("bias_kv_zero_attn_combined", B=2, T=5, S=6, E=12, h=3, kdim=7, vdim=4,
              kpm="bool", attn_mask="float3d", causal=True, add_bias_kv=True, add_zero_attn=True,
              dtypes=("f64", "f32"))


if __name__ == "__main__":
    main()
