#!/usr/bin/python3
"""tiny_lm's model and training in PyTorch, step for step against attograd's.

Run by hand (never by CI) with Debian's python3-torch, from the source tree,
after building:

    /usr/bin/python3 examples/tiny_lm/reference.py [--bin build/examples/tiny_lm]

It runs tiny_lm in float64 without dropout for 20 steps (small sizes, so that
it is quick), starting from weights tiny_lm wrote (--steps 0 --save), and
trains the same model in PyTorch from those weights on the same batches
(pcg32, below, draws the same windows), with the same AdamW groups, schedule
and clipping. It checks that:
  1. the 20 training losses agree within 1e-9;
  2. tiny_lm's checkpoint after 20 steps loads strictly into the PyTorch model
     and gives the validation loss tiny_lm reported (within 1e-9);
  3. the weights PyTorch trained, saved with tiny_lm's metadata, load into
     tiny_lm (--generate) and sample.
Exit status 0 when all hold.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "pytorch"))
import safetensors_io as sio  # noqa: E402

MASK64 = (1 << 64) - 1


class Pcg32:
    """pcg32 (XSH-RR 64/32), seeded as pcg32_srandom_r: attograd's ag_pcg32."""

    def __init__(self, initstate, initseq):
        self.state, self.inc = 0, ((initseq << 1) | 1) & MASK64
        self.next()
        self.state = (self.state + initstate) & MASK64
        self.next()

    def next(self):
        old = self.state
        self.state = (old * 6364136223846793005 + self.inc) & MASK64
        xorshifted = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xorshifted >> rot) | (xorshifted << ((-rot) & 31))) & 0xFFFFFFFF

    def bounded(self, bound):
        threshold = (-bound & 0xFFFFFFFF) % bound
        while True:
            r = self.next()
            if r >= threshold:
                return r % bound


def load_text(path, valid_fraction):
    """As examples/common/text.c: a file, or a directory's regular files by name."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if not n.startswith("."))
        files = [os.path.join(path, n) for n in names]
        files = [f for f in files if os.path.isfile(f) and not os.path.islink(f)]
    else:
        files = [path]
    data = b"".join(open(f, "rb").read() for f in files)
    valid = int(len(data) * valid_fraction)
    return data, len(data) - valid


def windows(data, lo, hi, B, T, rng):
    ids, targets = [], []
    for _ in range(B):
        s = lo + rng.bounded(hi - lo - T)
        ids.append(list(data[s:s + T]))
        targets.append(list(data[s + 1:s + T + 1]))
    return torch.tensor(ids), torch.tensor(targets)


class TinyLM(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        E = cfg["d_model"]
        ff = cfg["ff"] or 4 * E
        self.wte = torch.nn.Embedding(256, E)
        self.wpe = torch.nn.Embedding(cfg["ctx"], E)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(E, cfg["heads"], ff, cfg["dropout"], activation="gelu",
                                             batch_first=True, norm_first=True)
            for _ in range(cfg["layers"]))
        self.ln_f = torch.nn.LayerNorm(E)
        self.head = torch.nn.Linear(E, 256, bias=False) if cfg["untied"] else None

    def forward(self, ids):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for b in self.blocks:
            x = b(x, src_mask=mask)
        x = self.ln_f(x)
        return x @ (self.head.weight if self.head is not None else self.wte.weight).T


def lr_at(step, warmup, total, base, minimum):
    if step < warmup:
        return base * (step + 1) / warmup
    if step >= total:
        return minimum
    q = (step - warmup) / (total - warmup)
    return minimum + 0.5 * (base - minimum) * (1 + math.cos(math.pi * q))


def read_csv(path):
    lines = open(path).read().split("\n")[1:]
    return [[float(v) for v in line.split(",")] for line in lines if line]


def bench(args):
    """Training tokens/s of the same model in float32 (with dropout, as tiny_lm trains),
    after 3 warm-up steps; prints one line: "tokens/s N"."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = {"d_model": args.d_model, "ctx": args.ctx, "heads": 4, "layers": args.layers, "ff": 0,
           "dropout": 0.1, "untied": False}
    model = TinyLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    data, train_len = load_text(args.data, 0.1)
    import time
    for step in range(args.bench + 3):
        if step == 3:
            t0 = time.perf_counter()
        ids, targets = windows(data, 0, train_len, args.batch, args.ctx, Pcg32(1, 1000 + step))
        loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 256), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print(f"tokens/s {args.bench * args.batch * args.ctx / (time.perf_counter() - t0):.0f}")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", type=int, default=0, help="only time this many training steps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bin", default="build/examples/tiny_lm")
    ap.add_argument("--data", default="/usr/share/common-licenses")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.bench:
        return bench(args)
    torch.set_default_dtype(torch.float64)
    work = tempfile.mkdtemp()
    size = ["--ctx", "32", "--d-model", "32", "--heads", "4", "--layers", "2", "--batch", "8",
            "--dropout", "0", "--f64", "--warmup", "5", "--eval-every", "10",
            "--eval-batches", "2", "--seed", str(args.seed), "--data", args.data,
            "--sample", "0"]
    run = lambda *a: subprocess.run([args.bin, *size, *a], check=True, capture_output=True)
    run("--steps", "0", "--save", f"{work}/init", "--out", f"{work}/init")
    run("--steps", str(args.steps), "--save", f"{work}/final", "--out", f"{work}/run")
    ours = read_csv(f"{work}/run.csv")

    init, meta = sio.load(f"{work}/init", torch=True)
    cfg = {}
    for k in ("ctx", "d_model", "heads", "layers", "ff", "batch", "warmup", "steps",
              "eval_every", "eval_batches", "seed"):
        cfg[k] = int(meta[k.replace("_", "-")])
    for k in ("lr", "min-lr", "weight-decay", "beta2", "clip", "valid", "dropout"):
        cfg[k.replace("-", "_")] = float(meta[k])
    cfg["untied"] = meta["untied"] == "true"
    model = TinyLM(cfg)
    model.load_state_dict({k: v for k, v in init.items() if not k.startswith("optimizer.")})
    model.train()
    params = dict(model.named_parameters())
    no_decay = [n for n, p in params.items() if p.dim() < 2 or n in ("wte.weight", "wpe.weight")]
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in params.items() if n not in no_decay]},
         {"params": [params[n] for n in no_decay], "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(0.9, cfg["beta2"]), eps=1e-8, weight_decay=cfg["weight_decay"])

    data, train_len = load_text(args.data, cfg["valid"])
    B, T, total = cfg["batch"], cfg["ctx"], args.steps
    worst = 0.0
    for step in range(total):
        ids, targets = windows(data, 0, train_len, B, T, Pcg32(cfg["seed"], 1000 + step))
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if cfg["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, min(cfg["warmup"], total), total, cfg["lr"], cfg["min_lr"])
        opt.step()
        diff = abs(loss.item() - ours[step][1])
        worst = max(worst, diff)
        print(f"step {step + 1:3d}  pytorch {loss.item():.15f}  attograd {ours[step][1]:.15f}"
              f"  diff {diff:.1e}")
    ok1 = worst <= 1e-9
    print(f"1. training losses: worst difference {worst:.2e} ({'ok' if ok1 else 'FAILED'})")

    # 2. attograd's final checkpoint in PyTorch: the validation loss it reported.
    final, _ = sio.load(f"{work}/final", torch=True)
    check = TinyLM(cfg)
    check.load_state_dict({k: v for k, v in final.items() if not k.startswith("optimizer.")})
    check.eval()
    rng, total_loss = Pcg32(cfg["seed"], 7), 0.0
    with torch.no_grad():
        for _ in range(cfg["eval_batches"]):
            ids, targets = windows(data, train_len, len(data), B, T, rng)
            total_loss += torch.nn.functional.cross_entropy(
                check(ids).reshape(-1, 256), targets.reshape(-1)).item()
    theirs = total_loss / cfg["eval_batches"] / math.log(2)
    diff = abs(theirs - ours[-1][2])
    ok2 = diff <= 1e-9
    print(f"2. attograd's checkpoint in PyTorch: validation {theirs:.12f} bits/byte, attograd "
          f"{ours[-1][2]:.12f} ({'ok' if ok2 else 'FAILED'})")

    # 3. PyTorch's weights into attograd.
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    sio.save(sd, f"{work}/torch", metadata=meta)
    out = subprocess.run([args.bin, "--generate", f"{work}/torch", "--sample", "80"],
                         capture_output=True, text=True, errors="replace")
    ok3 = out.returncode == 0
    print(f"3. PyTorch's weights in attograd (--generate): {'ok' if ok3 else 'FAILED'}")
    print(out.stdout if ok3 else out.stderr)
    return 0 if ok1 and ok2 and ok3 else 1


if __name__ == "__main__":
    sys.exit(main())
