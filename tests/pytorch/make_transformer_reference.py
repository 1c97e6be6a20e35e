#!/usr/bin/python3
"""Writes tests/reference/transformer_pytorch.safetensors: torch.nn.TransformerDecoderLayer
and torch.nn.Transformer (batch_first=True, dropout 0) cases in float64 — the state_dict,
the inputs, an upstream gradient, the output, and the gradients of the inputs and of every
parameter. tests/test_transformer_pytorch.c loads each state_dict into attograd's decoder
layer or transformer and compares (per tensor, max |ours - torch| <= tol * max |torch|).

Layout: decoder-layer case i stores "d<i>.param.<state_dict name>", "d<i>.tgt",
"d<i>.memory", "d<i>.grad_out", "d<i>.out", "d<i>.grad.tgt", "d<i>.grad.memory",
"d<i>.grad.<state_dict name>", and the masks it uses: "d<i>.tgt_key_padding_mask" [B,T],
"d<i>.memory_key_padding_mask" [B,S] (bool, true = padding), "d<i>.tgt_mask" and
"d<i>.memory_mask" ([T,T] and [T,S]: bool, true = may not attend, or float, added).
A causal case (causal=1 in its config) gives torch the [T,T] triu(1) mask and attograd
its causal flag. Transformer case i ("t<i>.") stores the same with "src" for the
encoder's input and "src_key_padding_mask" (also passed as memory_key_padding_mask, as a
translation model does, unless the case has a "memory_key_padding_mask" of its own), and
"src_mask" [S,S] and "memory_mask" [T,S] when it uses them; "eps" in its config is the
layers' layer_norm_eps (1e-5 when absent). Metadata "d<i>.config" / "t<i>.config":
"key=value" pairs; "decoder_cases" and "transformer_cases" count them. Inputs are
float32-exact.

Never is every key of a query masked: PyTorch gives NaN there (attograd zeros, by design).

Run by hand (needs torch; never run by CI), from the repository root:
    /usr/bin/python3 tests/pytorch/make_transformer_reference.py
and, to load a checkpoint attograd wrote (tests/test_transformer_pytorch.c writes
transformer_from_attograd.safetensors in its working directory) into nn.Transformer with
strict=True and compare its output with attograd's:
    /usr/bin/python3 tests/pytorch/make_transformer_reference.py --check FILE
"""
import copy
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402

OUT = os.path.join(ROOT, "tests", "reference", "transformer_pytorch.safetensors")
D = torch.float64


def f32_exact(t):
    return t.float().double()


def rand(*shape):
    return f32_exact(torch.rand(*shape, dtype=D) * 2 - 1)


def randomise(module):
    with torch.no_grad():  # move every parameter off its special init values
        for p in module.parameters():
            p.copy_(f32_exact(torch.rand_like(p) * 1.4 - 0.7))


def padding(B, L, first_free):
    """A key padding mask [B, L] that pads a position or two, never position 0 (with a
    causal mask, query 0 sees key 0 alone)."""
    m = torch.zeros(B, L, dtype=torch.bool)
    if L > 1:
        m[0, -1] = True
    if L > 2 and B > 1:
        m[1, max(first_free, 1)] = True
    return m


def attn_mask(kind, T, S):
    """kind 'bool': a [T, S] mask blocking some keys but never all of a row; 'float': an
    additive [T, S] mask of finite values; 'causal': triu(1)."""
    if kind == "causal":
        return torch.ones(T, S, dtype=torch.bool).triu(1)
    if kind == "bool":
        m = torch.rand(T, S) < 0.3
        m[:, 0] = False
        return m
    return rand(T, S) * 2


def store_masks(prefix, tensors, masks):
    for name, m in masks.items():
        if m is not None:
            tensors[f"{prefix}.{name}"] = m


def f32_error(module, inputs, run, out, grad_out):
    """PyTorch's own float32 error on the case: the worst, over the output and every
    gradient, of max |f32 - f64| / max |f64|."""
    m32 = copy.deepcopy(module).float()
    x32 = {k: v.detach().float().requires_grad_(True) for k, v in inputs.items()}
    y32 = run(m32, x32)
    y32.backward(grad_out.float())
    pairs = [(y32, out)] + [(x32[k].grad, inputs[k].grad) for k in inputs]
    pairs += [(p32.grad, p.grad) for p32, p in zip(m32.parameters(), module.parameters())]
    return max(((a.double() - b).abs().max() / b.abs().max()).item() for a, b in pairs)


def record(prefix, tensors, meta, module, inputs, run):
    out = run(module, inputs)
    grad_out = rand(*out.shape)
    out.backward(grad_out)
    meta[f"{prefix}.torch_f32_error"] = repr(f32_error(module, inputs, run, out, grad_out))
    for name, p in module.state_dict().items():
        tensors[f"{prefix}.param.{name}"] = p
    for name, p in module.named_parameters():
        tensors[f"{prefix}.grad.{name}"] = p.grad
    for name, x in inputs.items():
        tensors[f"{prefix}.{name}"] = x.detach()
        tensors[f"{prefix}.grad.{name}"] = x.grad
    tensors[f"{prefix}.grad_out"] = grad_out
    tensors[f"{prefix}.out"] = out.detach()


DECODER = [
    dict(d_model=8, nhead=2, ff=16, act="relu", norm_first=0, B=2, T=5, S=7, causal=1),
    dict(d_model=8, nhead=4, ff=12, act="gelu", norm_first=1, B=3, T=4, S=3, causal=1,
         tgt_kpm=1, mem_kpm=1),
    dict(d_model=6, nhead=3, ff=10, act="relu", norm_first=0, B=2, T=1, S=4, mem_kpm=1),
    dict(d_model=8, nhead=1, ff=8, act="gelu", norm_first=1, B=2, T=6, S=6, tgt_mask="float",
         memory_mask="bool"),
    dict(d_model=12, nhead=4, ff=20, act="relu", norm_first=1, B=2, T=3, S=9, causal=1,
         memory_mask="float", mem_kpm=1),
    dict(d_model=8, nhead=2, ff=12, act="gelu", norm_first=0, B=1, T=7, S=2, tgt_mask="bool",
         tgt_kpm=1),
]
TRANSFORMER = [
    dict(d_model=8, nhead=2, ff=16, act="relu", norm_first=0, enc=2, dec=2, B=2, S=6, T=5,
         causal=1, src_kpm=1),
    dict(d_model=8, nhead=4, ff=12, act="gelu", norm_first=1, enc=2, dec=2, B=2, S=4, T=7,
         causal=1, tgt_kpm=1),
    dict(d_model=6, nhead=2, ff=8, act="gelu", norm_first=0, enc=1, dec=3, B=3, S=5, T=1,
         src_kpm=1),
    dict(d_model=8, nhead=2, ff=10, act="relu", norm_first=1, enc=3, dec=1, B=2, S=3, T=6,
         causal=1, src_kpm=1, tgt_kpm=1),
    # Every mask at once, and another layer_norm_eps; then one position of one sequence.
    dict(d_model=8, nhead=2, ff=12, act="gelu", norm_first=1, enc=2, dec=2, B=3, S=4, T=5,
         causal=1, eps=1e-3, src_mask="float", memory_mask="bool", src_kpm=1, tgt_kpm=1,
         mem_kpm=1),
    dict(d_model=8, nhead=2, ff=12, act="relu", norm_first=0, enc=1, dec=1, B=1, S=1, T=1),
]


def decoder_case(i, c, tensors, meta):
    layer = torch.nn.TransformerDecoderLayer(c["d_model"], c["nhead"], c["ff"], dropout=0.0,
                                             activation=c["act"], batch_first=True,
                                             norm_first=bool(c["norm_first"])).double()
    randomise(layer)
    B, T, S, E = c["B"], c["T"], c["S"], c["d_model"]
    tgt = rand(B, T, E).requires_grad_(True)
    memory = rand(B, S, E).requires_grad_(True)
    masks = {
        "tgt_mask": attn_mask(c["tgt_mask"], T, T) if "tgt_mask" in c else None,
        "memory_mask": attn_mask(c["memory_mask"], T, S) if "memory_mask" in c else None,
        "tgt_key_padding_mask": padding(B, T, 1) if c.get("tgt_kpm") else None,
        "memory_key_padding_mask": padding(B, S, 1) if c.get("mem_kpm") else None,
    }
    tgt_mask = attn_mask("causal", T, T) if c.get("causal") else masks["tgt_mask"]

    def run(module, x):
        dt = x["tgt"].dtype
        cast = lambda m: m.to(dt) if m is not None and m.is_floating_point() else m  # noqa
        return module(x["tgt"], x["memory"], tgt_mask=cast(tgt_mask),
                      memory_mask=cast(masks["memory_mask"]),
                      tgt_key_padding_mask=masks["tgt_key_padding_mask"],
                      memory_key_padding_mask=masks["memory_key_padding_mask"])
    record(f"d{i}", tensors, meta, layer, {"tgt": tgt, "memory": memory}, run)
    store_masks(f"d{i}", tensors, masks)
    meta[f"d{i}.config"] = " ".join(f"{k}={v}" for k, v in c.items())


def make_transformer(c):
    return torch.nn.Transformer(c["d_model"], c["nhead"], c["enc"], c["dec"], c["ff"],
                                dropout=0.0, activation=c["act"], batch_first=True,
                                norm_first=bool(c["norm_first"]),
                                layer_norm_eps=c.get("eps", 1e-5)).double()


def transformer_case(i, c, tensors, meta):
    model = make_transformer(c)
    randomise(model)
    B, T, S, E = c["B"], c["T"], c["S"], c["d_model"]
    src = rand(B, S, E).requires_grad_(True)
    tgt = rand(B, T, E).requires_grad_(True)
    masks = {
        "src_key_padding_mask": padding(B, S, 2) if c.get("src_kpm") else None,
        "tgt_key_padding_mask": padding(B, T, 1) if c.get("tgt_kpm") else None,
        "memory_key_padding_mask": padding(B, S, 1) if c.get("mem_kpm") else None,
        "src_mask": attn_mask(c["src_mask"], S, S) if "src_mask" in c else None,
        "memory_mask": attn_mask(c["memory_mask"], T, S) if "memory_mask" in c else None,
    }
    memory_kpm = masks["memory_key_padding_mask"]
    if memory_kpm is None:
        memory_kpm = masks["src_key_padding_mask"]
    def run(module, x):
        return module(x["src"], x["tgt"], src_mask=masks["src_mask"],
                      tgt_mask=attn_mask("causal", T, T) if c.get("causal") else None,
                      memory_mask=masks["memory_mask"],
                      src_key_padding_mask=masks["src_key_padding_mask"],
                      tgt_key_padding_mask=masks["tgt_key_padding_mask"],
                      memory_key_padding_mask=memory_kpm)
    record(f"t{i}", tensors, meta, model, {"src": src, "tgt": tgt}, run)
    store_masks(f"t{i}", tensors, masks)
    meta[f"t{i}.config"] = " ".join(f"{k}={v}" for k, v in c.items())


def check(path):
    """Loads attograd's checkpoint of transformer case 0 into nn.Transformer, strictly,
    and compares the output on the case's inputs."""
    st, _ = sio.load(path, torch=True)
    ref, _ = sio.load(OUT, torch=True)
    model = make_transformer(TRANSFORMER[0])
    model.load_state_dict({k: v.double() for k, v in st.items()}, strict=True)
    c = TRANSFORMER[0]
    out = model(ref["t0.src"], ref["t0.tgt"], tgt_mask=attn_mask("causal", c["T"], c["T"]),
                src_key_padding_mask=ref["t0.src_key_padding_mask"],
                memory_key_padding_mask=ref["t0.src_key_padding_mask"])
    err = ((out - ref["t0.out"]).abs().max() / ref["t0.out"].abs().max()).item()
    print(f"{path}: loaded into nn.Transformer with strict=True; output relative error {err:.2e}")
    sys.exit(0 if err <= 1e-12 else 1)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    torch.manual_seed(23)
    tensors, meta = {}, {}
    for i, c in enumerate(DECODER):
        decoder_case(i, c, tensors, meta)
    for i, c in enumerate(TRANSFORMER):
        transformer_case(i, c, tensors, meta)
    meta["decoder_cases"] = str(len(DECODER))
    meta["transformer_cases"] = str(len(TRANSFORMER))
    meta["written_by"] = f"torch {torch.__version__}"
    sio.save(tensors, OUT, meta)
    print(f"wrote {len(DECODER)} decoder-layer and {len(TRANSFORMER)} transformer cases to "
          f"{os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
