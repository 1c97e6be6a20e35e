#!/usr/bin/python3
"""The copy-task training step of bench_step.c, in PyTorch: token + position
embedding, causal nn.MultiheadAttention (batch_first), residual, LayerNorm,
linear head, cross-entropy (ignore_index -100), Adam. B = 64, T = 32,
d_model 64, 4 heads, vocabulary 11, float32.

Run by hand with the system Python and torch 1.13:  /usr/bin/python3 bench/pytorch_step.py
Prints the median ms per phase over the same number of steps as bench_step.c,
1 and 2 threads interleaved round by round. OpenBLAS (which Debian's torch
calls for its products) is pinned to torch's thread count, as in pytorch_mha.py.
"""
import ctypes
import statistics
import time

import torch

OPENBLAS = ctypes.CDLL("libopenblas.so.0")
B, T, E, H, V = 64, 32, 64, 4, 11
WARMUP, STEPS, ROUNDS = 5, 60, 3


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


def main():
    torch.manual_seed(1)
    models = {}
    for threads in (1, 2):
        m = Model()
        models[threads] = (m, torch.optim.Adam(m.parameters(), lr=1e-3))
    ids = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    targets[:, : T // 2] = -100
    samples = {t: {"forward": [], "backward": [], "optimizer": [], "step": []} for t in (1, 2)}
    for _ in range(ROUNDS):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            OPENBLAS.openblas_set_num_threads(threads)
            m, opt = models[threads]
            for s in range(WARMUP + STEPS):
                t0 = time.perf_counter()
                opt.zero_grad()
                logits = m(ids)
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                                                         ignore_index=-100)
                t1 = time.perf_counter()
                loss.backward()
                t2 = time.perf_counter()
                opt.step()
                t3 = time.perf_counter()
                if s >= WARMUP:
                    for k, v in (("forward", t1 - t0), ("backward", t2 - t1),
                                 ("optimizer", t3 - t2), ("step", t3 - t0)):
                        samples[threads][k].append(v)
    print(f"torch {torch.__version__}: copy-task training step (B={B} T={T} E={E} h={H} V={V}, "
          f"f32), median ms over {ROUNDS * STEPS} steps")
    print("%-10s %10s %10s" % ("phase", "1 thread", "2 threads"))
    for k in ("forward", "backward", "optimizer", "step"):
        print("%-10s %10.3f %10.3f" % (k, 1e3 * statistics.median(samples[1][k]),
                                      1e3 * statistics.median(samples[2][k])))


if __name__ == "__main__":
    main()
