#!/usr/bin/python3
"""The copy-task training step of bench_step.c, in PyTorch: token + position
embedding, causal nn.MultiheadAttention (batch_first), residual, LayerNorm,
linear head, cross-entropy (ignore_index -100), Adam. B = 64, T = 32,
d_model 64, 4 heads, vocabulary 11, float32.

Run by hand with the system Python and torch 1.13:
    /usr/bin/python3 bench/pytorch_step.py [--memory installed|kept|both] [--threads N]
Prints the median ms per phase over the same number of steps as bench_step.c, 1 and 2
threads (or N) taking turns round by round. OpenBLAS (which Debian's torch calls for its
products) is pinned to torch's thread count, as in pytorch_mha.py, and each memory setting
("installed", and "kept": glibc told to keep freed memory, see pytorch_mha.py) runs in a
fresh interpreter, labelled.
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time

KEPT = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
B, T, E, H, V = 64, 32, 64, 4, 11
WARMUP, STEPS, ROUNDS = 5, 60, 3


def run(threads_list, memory):
    import torch

    openblas = ctypes.CDLL("libopenblas.so.0")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = torch.nn.Embedding(V, E)
            self.pos = torch.nn.Embedding(T, E)
            self.attn = torch.nn.MultiheadAttention(E, H, batch_first=True)
            self.norm = torch.nn.LayerNorm(E)
            self.head = torch.nn.Linear(E, V)
            self.register_buffer("causal", torch.ones(T, T, dtype=torch.bool).triu(1))

        def forward(self, ids):
            x = self.tok(ids) + self.pos.weight[:T]
            a, _ = self.attn(x, x, x, attn_mask=self.causal, need_weights=False)
            return self.head(self.norm(x + a))

    torch.manual_seed(1)
    models = {}
    for threads in threads_list:
        m = Model()
        models[threads] = (m, torch.optim.Adam(m.parameters(), lr=1e-3))
    ids = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    targets[:, : T // 2] = -100
    phases = ("forward", "backward", "optimizer", "step")
    samples = {t: {k: [] for k in phases} for t in threads_list}
    for _ in range(ROUNDS):
        for threads in threads_list:
            torch.set_num_threads(threads)
            openblas.openblas_set_num_threads(threads)
            m, opt = models[threads]
            for s in range(WARMUP + STEPS):
                t0 = time.perf_counter()
                opt.zero_grad()
                logits = m(ids)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                                         targets.reshape(-1), ignore_index=-100)
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                opt.step()
                t3 = time.perf_counter()
                if s >= WARMUP:
                    for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                        samples[threads][k].append(v)
    print(f"torch {torch.__version__} ({memory} memory): copy-task training step "
          f"(B={B} T={T} E={E} h={H} V={V}, f32), median ms over {ROUNDS * STEPS} steps")
    print("%-10s" % "phase" + "".join("%12s" % f"{t} thread{'s' if t > 1 else ''}"
                                      for t in threads_list))
    for k in phases:
        print("%-10s" % k + "".join("%12.3f" % (1e3 * statistics.median(samples[t][k]))
                                    for t in threads_list))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memory", choices=("installed", "kept", "both"), default="both")
    ap.add_argument("--threads", type=int, default=0, help="1 or 2 (default: both)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    threads = [args.threads] if args.threads else [1, 2]
    if args.child or args.memory == "installed" and "GLIBC_TUNABLES" not in os.environ:
        run(threads, args.memory)
        return
    for memory in (("installed", "kept") if args.memory == "both" else (args.memory,)):
        env = dict(os.environ)
        env.pop("GLIBC_TUNABLES", None)
        if memory == "kept":
            env["GLIBC_TUNABLES"] = KEPT
        cmd = [sys.executable, os.path.abspath(__file__), "--memory", memory, "--child",
               "--threads", str(args.threads)]
        subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
