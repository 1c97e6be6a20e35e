#!/usr/bin/python3
"""tiny_lm's model and training in PyTorch, against attograd's.

Run by hand (never by CI) with Debian's python3-torch, from the source tree,
after building:

    /usr/bin/python3 examples/tiny_lm/reference.py [--bin build/examples/tiny_lm]
    /usr/bin/python3 examples/tiny_lm/reference.py --compare [--seeds 1 2]

Without --compare it runs tiny_lm in float64 without dropout for 20 steps
(small sizes, so that it is quick), starting from weights tiny_lm wrote (--steps
0 --save), and trains the same model in PyTorch from those weights on the same
batches (pcg32, below, draws the same windows), with the same AdamW groups,
schedule and clipping. It checks that:
  1. the 20 training losses agree within 1e-9;
  2. tiny_lm's checkpoint after 20 steps loads strictly into the PyTorch model
     and gives the validation loss tiny_lm reported (within 1e-9);
  3. PyTorch's run, weights and AdamW state saved as a tiny_lm checkpoint,
     resumes in tiny_lm (--resume) for 5 more steps with the losses PyTorch
     computes for them, training and validation, within 1e-9.
Exit status 0 when all hold.

--compare trains the default model (4 layers, d_model 64, context 64, batch 32,
dropout 0.1, float32, 2000 steps) on the default data in attograd and in
PyTorch, for each seed, from the same initial weights and on the same batches
(the dropout masks differ: each library draws its own), and prints the final
validation losses in bits per byte side by side with the bigram baseline's.
It takes tens of minutes.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

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
    """examples/tiny_lm/model.c with learned positions (--pos learned)."""

    def __init__(self, cfg):
        super().__init__()
        E = cfg["d_model"]
        ff = cfg["ff"] or 4 * E
        self.wte = torch.nn.Embedding(256, E)
        self.wpe = torch.nn.Embedding(cfg["ctx"], E)
        self.drop = torch.nn.Dropout(cfg["dropout"])
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(E, cfg["heads"], ff, cfg["dropout"],
                                             activation="gelu", batch_first=True,
                                             norm_first=True)
            for _ in range(cfg["layers"]))
        self.ln_f = torch.nn.LayerNorm(E)
        self.head = torch.nn.Linear(E, 256, bias=False) if cfg["untied"] else None

    def forward(self, ids):
        T = ids.shape[1]
        x = self.drop(self.wte(ids) + self.wpe(torch.arange(T)))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for b in self.blocks:
            x = b(x, src_mask=mask)
        x = self.ln_f(x)
        return x @ (self.head.weight if self.head is not None else self.wte.weight).T


def lr_at(step, warmup, total, base, minimum):
    """ag_lr_warmup_cosine, in its order of operations."""
    if step < warmup:
        return base * ((step + 1) / warmup)
    if step >= total:
        return minimum
    q = (step - warmup) / (total - warmup)
    lr = base - (base - minimum) * (0.5 * (1 - math.cos(math.pi * q)))
    return minimum if (lr < minimum if base >= minimum else lr > minimum) else lr


def read_csv(path):
    """tiny_lm's CSV rows: step, train bits/byte, valid bits/byte (nan), lr, tokens/s."""
    lines = open(path).read().split("\n")[1:]
    return [[float(v) for v in line.split(",")] for line in lines if line]


def config_of(meta):
    cfg = {}
    for k in ("ctx", "d_model", "heads", "layers", "ff", "batch", "warmup", "steps",
              "eval_every", "eval_batches", "seed"):
        cfg[k] = int(meta[k.replace("_", "-")])
    for k in ("lr", "min-lr", "weight-decay", "beta2", "clip", "valid", "dropout"):
        cfg[k.replace("-", "_")] = float(meta[k])
    cfg["untied"] = meta["untied"] == "true"
    if meta.get("pos", "learned") != "learned":
        raise SystemExit("reference.py: only --pos learned has a PyTorch model here")
    return cfg


def model_from(path, cfg):
    weights, _ = sio.load(path, torch=True)
    model = TinyLM(cfg)
    model.load_state_dict({k: v for k, v in weights.items() if not k.startswith("optimizer.")})
    return model


def adamw_of(model, cfg):
    """AdamW with tiny_lm's groups: no decay on biases, LayerNorms and embeddings."""
    params = dict(model.named_parameters())
    no_decay = [n for n, p in params.items() if p.dim() < 2 or n in ("wte.weight", "wpe.weight")]
    return torch.optim.AdamW(
        [{"params": [p for n, p in params.items() if n not in no_decay]},
         {"params": [params[n] for n in no_decay], "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(0.9, cfg["beta2"]), eps=1e-8, weight_decay=cfg["weight_decay"])


def train_steps(model, opt, cfg, data, train_len, first, last, total):
    """Steps [first, last) of a run of `total` steps, as tiny_lm takes them: the
    training loss of each, in bits per byte."""
    model.train()
    B, T, losses = cfg["batch"], cfg["ctx"], []
    for step in range(first, last):
        ids, targets = windows(data, 0, train_len, B, T, Pcg32(cfg["seed"], 1000 + step))
        loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 256), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if cfg["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, min(cfg["warmup"], total), total, cfg["lr"], cfg["min_lr"])
        opt.step()
        losses.append(loss.item() / math.log(2))
    return losses


def validate(model, cfg, data, train_len):
    """tiny_lm's validation: bits per byte over the same fixed windows."""
    model.eval()
    rng, total = Pcg32(cfg["seed"], 7), 0.0
    with torch.no_grad():
        for _ in range(cfg["eval_batches"]):
            ids, targets = windows(data, train_len, len(data), cfg["batch"], cfg["ctx"], rng)
            total += torch.nn.functional.cross_entropy(
                model(ids).reshape(-1, 256), targets.reshape(-1)).item()
    model.train()
    return total / cfg["eval_batches"] / math.log(2)


def save_as_tiny_lm(model, opt, meta, step, path):
    """PyTorch's model and AdamW state as a tiny_lm training checkpoint."""
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    for name, p in model.named_parameters():
        state = opt.state[p]
        tensors[f"optimizer.exp_avg.{name}"] = state["exp_avg"]
        tensors[f"optimizer.exp_avg_sq.{name}"] = state["exp_avg_sq"]
    sio.save(tensors, path, {**meta, "optimizer.step": str(step)})


def bench(args):
    """Training tokens/s of the same model in float32 (with dropout --dropout, 0.1 as tiny_lm
    trains by default), after 3 warm-up steps; prints one line: "tokens/s N". With --cpu, by
    the process's CPU time instead of the wall clock (with --threads 1, for a busy machine)."""
    clock = time.process_time if args.cpu else time.perf_counter
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = {"d_model": args.d_model, "ctx": args.ctx, "heads": args.heads, "layers": args.layers,
           "ff": 0, "dropout": args.dropout, "untied": False}
    model = TinyLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    data, train_len = load_text(args.data, 0.1)
    for step in range(args.bench + 3):
        if step == 3:
            t0 = clock()
        ids, targets = windows(data, 0, train_len, args.batch, args.ctx, Pcg32(1, 1000 + step))
        loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 256), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print(f"tokens/s {args.bench * args.batch * args.ctx / (clock() - t0):.0f}")
    return 0


def compare(args):
    """The default training in attograd and in PyTorch, seed by seed."""
    torch.set_num_threads(args.threads)
    torch.set_default_dtype(torch.float32)
    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as work:
            common = [args.bin, "--seed", str(seed), "--data", args.data, "--sample", "0",
                      "--threads", str(args.threads)]
            if args.steps_compare:
                common += ["--steps", str(args.steps_compare)]
            common += args.flags.split()
            subprocess.run(common + ["--steps", "0", "--save", f"{work}/init", "--out",
                                     f"{work}/init"], check=True, capture_output=True)
            t0 = time.time()
            out = subprocess.run(common + ["--out", f"{work}/run"], check=True,
                                 capture_output=True, text=True).stdout
            ours_s = time.time() - t0
            baseline = next(line for line in out.split("\n") if line.startswith("baselines"))
            bigram = float(baseline.rsplit(" ", 1)[1])
            last = read_csv(f"{work}/run.csv")[-1]
            ours = last[2]
            _, meta = sio.load(f"{work}/init")
            cfg = config_of(meta)
            cfg["steps"] = int(last[0])  # the init file says 0
            torch.manual_seed(seed)
            model = model_from(f"{work}/init", cfg)
            opt = adamw_of(model, cfg)
            data, train_len = load_text(args.data, cfg["valid"])
            t0 = time.time()
            train_steps(model, opt, cfg, data, train_len, 0, cfg["steps"], cfg["steps"])
            theirs = validate(model, cfg, data, train_len)
            theirs_s = time.time() - t0
        rows.append((seed, ours, theirs, bigram, ours_s, theirs_s))
        print(f"seed {seed}: attograd {ours:.3f}, PyTorch {theirs:.3f} bits/byte "
              f"({ours_s:.0f} s and {theirs_s:.0f} s)", flush=True)
    flags = f" with {args.flags}" if args.flags else ""
    print(f"validation bits/byte after {cfg['steps']} steps{flags} "
          f"(bigram baseline {rows[0][3]:.3f})")
    print("| seed | attograd | PyTorch | attograd below bigram |")
    print("|---|---|---|---|")
    for seed, ours, theirs, bigram, _, _ in rows:
        print(f"| {seed} | {ours:.3f} | {theirs:.3f} | {bigram - ours:.3f} |")
    return 0


def check(args):
    torch.set_default_dtype(torch.float64)
    with tempfile.TemporaryDirectory() as work:
        size = ["--ctx", "32", "--d-model", "32", "--heads", "4", "--layers", "2", "--batch", "8",
                "--dropout", "0", "--f64", "--warmup", "5", "--eval-every", "10",
                "--eval-batches", "2", "--seed", str(args.seed), "--data", args.data,
                "--sample", "0"]
        run = lambda *a: subprocess.run([args.bin, *size, *a], check=True, capture_output=True)
        run("--steps", "0", "--save", f"{work}/init", "--out", f"{work}/init")
        run("--steps", str(args.steps), "--save", f"{work}/final", "--out", f"{work}/run")
        ours = read_csv(f"{work}/run.csv")

        _, meta = sio.load(f"{work}/init")
        cfg = config_of(meta)
        model = model_from(f"{work}/init", cfg)
        opt = adamw_of(model, cfg)
        data, train_len = load_text(args.data, cfg["valid"])
        theirs = train_steps(model, opt, cfg, data, train_len, 0, args.steps, args.steps)
        worst = 0.0
        for step, (t, o) in enumerate(zip(theirs, ours)):
            diff = abs(t - o[1])
            worst = max(worst, diff)
            print(f"step {step + 1:3d}  pytorch {t:.15f}  attograd {o[1]:.15f}  diff {diff:.1e}")
        ok1 = worst <= 1e-9 and len(theirs) == len(ours)
        print(f"1. training losses (bits/byte): worst difference {worst:.2e} "
              f"({'ok' if ok1 else 'FAILED'})")

        # 2. attograd's final checkpoint in PyTorch: the validation loss it reported.
        v = validate(model_from(f"{work}/final", cfg), cfg, data, train_len)
        ok2 = abs(v - ours[-1][2]) <= 1e-9
        print(f"2. attograd's checkpoint in PyTorch: validation {v:.12f} bits/byte, attograd "
              f"{ours[-1][2]:.12f} ({'ok' if ok2 else 'FAILED'})")

        # 3. PyTorch's run (weights and AdamW state) resumed in attograd: 5 more steps.
        _, final_meta = sio.load(f"{work}/final")
        save_as_tiny_lm(model, opt, final_meta, args.steps, f"{work}/torch")
        more = args.steps + 5
        subprocess.run([args.bin, "--resume", f"{work}/torch", "--steps", str(more), "--out",
                        f"{work}/cont"], check=True, capture_output=True)
        ours3 = read_csv(f"{work}/cont.csv")
        theirs3 = train_steps(model, opt, cfg, data, train_len, args.steps, more, more)
        v3 = validate(model, cfg, data, train_len)
        diffs = [abs(t - o[1]) for t, o in zip(theirs3, ours3)] + [abs(v3 - ours3[-1][2])]
        ok3 = len(ours3) == 5 and max(diffs) <= 1e-9
        print(f"3. PyTorch's run resumed in attograd: steps {args.steps + 1}-{more} and the "
              f"validation after them differ by at most {max(diffs):.2e} "
              f"({'ok' if ok3 else 'FAILED'})")
    return 0 if ok1 and ok2 and ok3 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", type=int, default=0, help="only time this many training steps")
    ap.add_argument("--compare", action="store_true",
                    help="the default training in attograd and in PyTorch, side by side")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="for --compare")
    ap.add_argument("--steps-compare", type=int, default=0,
                    help="for --compare: steps (default: tiny_lm's, 2000)")
    ap.add_argument("--flags", default="", help="for --compare: more tiny_lm flags, e.g. "
                    "'--dropout 0' (the PyTorch model takes them from tiny_lm's checkpoint)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4, help="for --bench")
    ap.add_argument("--dropout", type=float, default=0.1, help="for --bench")
    ap.add_argument("--cpu", action="store_true", help="for --bench: CPU time, not wall time")
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
    if args.compare:
        return compare(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
