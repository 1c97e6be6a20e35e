#!/usr/bin/python3
"""torch.nn.MultiheadAttention forward + backward on the shapes of bench_mha.c.

Run by hand with the system Python and torch 1.13:  /usr/bin/python3 bench/pytorch_mha.py
(an argument 0..3 limits the run to one shape). Self-attention, float32, batch_first=True,
need_weights=False, no mask, no dropout; the input requires grad, as in bench_mha.c. The
time of a step is the best of at least MIN_RUNS steps after a warm-up step (more for small
shapes, until MIN_SECONDS have been timed), and GFLOP/s counts the same flops:
3 * (8 B T E^2 + 4 B T^2 E). The sgemm ceiling column is left to bench_mha.c, which
measures it; pass it with --ceiling 1T,2T to print %sgemm here too.

Threads: torch.set_num_threads sets torch's own (OpenMP) threads, but Debian's torch calls
the system OpenBLAS, a pthreads build with its own pool that uses every core whatever torch
is told: unpinned, "1 thread" runs its products on 2 (torch.mm at n = 1536 then reaches
~150 GFLOP/s, twice the one-core ceiling). So each run also pins OpenBLAS to the same count
(openblas_set_num_threads through ctypes); --unpinned leaves it alone, to show the default.
"""
import argparse
import ctypes
import time

import torch

OPENBLAS = ctypes.CDLL("libopenblas.so.0")  # the instance torch's libblas.so.3 resolves to

MIN_RUNS = 3
MIN_SECONDS = 1.0
SHAPES = [(64, 32, 64, 4), (8, 256, 256, 4), (4, 1024, 256, 4), (1, 4096, 128, 2)]


def measure(B, T, E, h, threads, pin):
    torch.set_num_threads(threads)
    OPENBLAS.openblas_set_num_threads(threads if pin else 2)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, h, batch_first=True)
    x = torch.empty(B, T, E).uniform_(-1, 1).requires_grad_(True)
    dy = torch.empty(B, T, E).uniform_(-1, 1)
    best, total, run = float("inf"), 0.0, 0
    while True:
        t0 = time.perf_counter()
        mha.zero_grad(set_to_none=False)
        x.grad = None
        y, _ = mha(x, x, x, need_weights=False)
        y.backward(dy)
        t = time.perf_counter() - t0
        if run > 0:
            best = min(best, t)
            total += t
        run += 1
        if run > MIN_RUNS and total >= MIN_SECONDS:
            break
    flop = 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E)
    return 1e3 * best, flop / best * 1e-9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", nargs="?", type=int, default=-1)
    ap.add_argument("--ceiling", default="", help="sgemm GFLOP/s on 1 and 2 threads, e.g. 94,163")
    ap.add_argument("--unpinned", action="store_true", help="let OpenBLAS use both cores")
    args = ap.parse_args()
    ceiling = [float(c) for c in args.ceiling.split(",")] if args.ceiling else None
    print(f"torch {torch.__version__} nn.MultiheadAttention f32 forward+backward, "
          "self-attention, need_weights=False, OpenBLAS threads "
          + ("unpinned (2)" if args.unpinned else "= torch threads"))
    print("%3s %5s %4s %2s | %-8s %3s | %9s %8s %7s" %
          ("B", "T", "E", "h", "path", "thr", "ms/step", "GFLOP/s", "%sgemm"))
    for s, (B, T, E, h) in enumerate(SHAPES):
        if args.shape >= 0 and s != args.shape:
            continue
        for threads in (1, 2):
            ms, gflops = measure(B, T, E, h, threads, not args.unpinned)
            pct = "%6.0f%%" % (100 * gflops / ceiling[threads - 1]) if ceiling else "%7s" % "-"
            print("%3d %5d %4d %2d | %-8s %3d | %9.2f %8.1f %s" %
                  (B, T, E, h, "pytorch", threads, ms, gflops, pct), flush=True)


if __name__ == "__main__":
    main()
