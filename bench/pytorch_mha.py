#!/usr/bin/python3
"""torch.nn.MultiheadAttention forward + backward on the shapes of bench_mha.c.

Run by hand with the system Python and torch 1.13:
    /usr/bin/python3 bench/pytorch_mha.py [--memory installed|kept|both] [B T E h [threads]]
Without a shape, the shapes of the speed table; without threads, 1 and 2. Self-attention,
float32, batch_first=True, need_weights=False, no mask, no dropout; the input requires
grad, as in bench_mha.c. A step's time is the median of at least MIN_RUNS steps after a
warm-up step (more for small shapes, until MIN_SECONDS have been timed), and GFLOP/s
counts the same flops as bench_mha: 3 * (8 B T E^2 + 4 B T^2 E).

Memory: PyTorch 1.13 allocates its T x T buffers anew at every step, and on this VM a
fresh 4 KiB page costs about 12.5 us to touch, so glibc returning freed memory to the
system (and taking it back next step) inflates PyTorch's times 1.5-5x. Each shape is
therefore timed twice, labelled: "installed" (as it comes) and "kept" (glibc told to keep
freed memory: GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=
68719476736, set before a fresh interpreter starts, since glibc reads it at start-up).
Claims against PyTorch are made against "kept".

Threads: torch.set_num_threads sets torch's own (OpenMP) threads, but Debian's torch calls
the system OpenBLAS, a pthreads build with its own pool that uses every core whatever torch
is told; each run therefore also pins OpenBLAS to the same count (openblas_set_num_threads
through ctypes).
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time

KEPT = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
MIN_RUNS = 5
MIN_SECONDS = 1.0
SHAPES = [(64, 32, 64, 4), (32, 64, 128, 4), (16, 128, 256, 8), (8, 512, 512, 8),
          (1, 2048, 512, 8), (1, 4096, 256, 4)]


def measure(B, T, E, h, threads):
    import torch
    openblas = ctypes.CDLL("libopenblas.so.0")  # the instance torch's libblas.so.3 uses
    torch.set_num_threads(threads)
    openblas.openblas_set_num_threads(threads)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, h, batch_first=True)
    x = torch.empty(B, T, E).uniform_(-1, 1).requires_grad_(True)
    dy = torch.empty(B, T, E).uniform_(-1, 1)
    times, run = [], 0
    while True:
        t0 = time.perf_counter()
        mha.zero_grad(set_to_none=False)
        x.grad = None
        y, _ = mha(x, x, x, need_weights=False)
        y.backward(dy)
        t = time.perf_counter() - t0
        if run > 0:
            times.append(t)
        run += 1
        if len(times) >= MIN_RUNS and sum(times) >= MIN_SECONDS:
            break
    mid = statistics.median(times)
    flop = 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E)
    return 1e3 * mid, flop / mid * 1e-9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="*", type=int, help="B T E h [threads]")
    ap.add_argument("--memory", choices=("installed", "kept", "both"), default="both")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if len(args.shape) not in (0, 4, 5):
        ap.error("give B T E h [threads], or nothing for the table's shapes")
    shapes = [tuple(args.shape[:4])] if args.shape else SHAPES
    threads = [args.shape[4]] if len(args.shape) == 5 else [1, 2]
    if args.memory == "both" or (args.memory == "kept" and not args.child):
        # Each setting in a fresh interpreter: glibc reads its tunables at start-up.
        for memory in (("installed", "kept") if args.memory == "both" else ("kept",)):
            env = dict(os.environ)
            env.pop("GLIBC_TUNABLES", None)
            if memory == "kept":
                env["GLIBC_TUNABLES"] = KEPT
            cmd = [sys.executable, os.path.abspath(__file__), "--memory", memory, "--child"]
            for shape in shapes:
                for t in threads:
                    out = subprocess.run(cmd + [str(v) for v in shape + (t,)], env=env,
                                         check=True, capture_output=True, text=True).stdout
                    print(out.rstrip().splitlines()[-1], flush=True)
        return
    import torch
    if not args.child:
        print(f"torch {torch.__version__} nn.MultiheadAttention f32 forward+backward, "
              "self-attention, need_weights=False, OpenBLAS threads = torch threads")
    for (B, T, E, h) in shapes:
        for t in threads:
            ms, gflops = measure(B, T, E, h, t)
            print("%3d %5d %4d %2d | %-17s %3d | %9.2f %8.1f" %
                  (B, T, E, h, "pytorch-" + args.memory, t, ms, gflops), flush=True)


if __name__ == "__main__":
    main()
