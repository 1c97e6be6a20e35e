#!/usr/bin/python3
"""Writes tests/reference/io_pytorch_written.safetensors from real torch
tensors (every dtype attograd stores, a scalar, a 4-D tensor, awkward values,
metadata), and checks the other direction: a file written by attograd (the C
program io_c_writer.c, built here against a build tree's libattograd.a)
reads back in Python with equal values, and is byte-identical to the file
written from PyTorch.

Run by hand from the repository root after building attograd:
    /usr/bin/python3 tests/pytorch/make_io_reference.py [--build build]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402

OUT = os.path.join(ROOT, "tests", "reference", "io_pytorch_written.safetensors")

METADATA = {"format": "pt", "written_by": "torch 1.13 via safetensors_io.py",
            "unicode": "caf\u00e9 \u2207"}


def reference_tensors():
    # The values tests/test_safetensors.c and io_c_writer.c spell out.
    return {
        "weight_f32": torch.tensor([[1.0, -2.5, 0.1], [3.4028234663852886e38, 1e-45, -0.0]],
                                   dtype=torch.float32),
        "values_f64": torch.tensor([0.1, -1e-310, float("inf"), float("nan")],
                                   dtype=torch.float64),
        "mask_bool": torch.tensor([[True, False, False], [True, True, False]]),
        "bytes_u8": torch.tensor([0, 1, 128, 255], dtype=torch.uint8),
        "ids_i64": torch.tensor([-2**63, -1, 2**63 - 1], dtype=torch.int64),
        "counts_i32": torch.tensor([-2**31, 123456789], dtype=torch.int32),
        "scalar_f32": torch.tensor(0.5, dtype=torch.float32),
        "kernel_f32_4d": (torch.arange(24, dtype=torch.float32) / 8 - 1).reshape(2, 3, 1, 4),
    }


def same(a, b):
    """Equal dtype, shape and bytes (so NaN equals NaN and -0.0 differs from 0.0)."""
    return (a.dtype == b.dtype and a.shape == b.shape and
            a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes())


def check_set(label, tensors, metadata, expected):
    ok = set(tensors) == set(expected) and metadata == METADATA
    for name, t in expected.items():
        if name not in tensors or not same(tensors[name], t):
            print(f"  {label}: {name} differs: {tensors.get(name)} vs {t}")
            ok = False
    print(f"{label}: {'ok' if ok else 'MISMATCH'} ({len(tensors)} tensors, metadata {metadata})")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="a build directory holding libattograd.a")
    args = ap.parse_args()

    expected = reference_tensors()
    sio.save(expected, OUT, METADATA)
    tensors, metadata = sio.load(OUT, torch=True)
    ok = check_set("PyTorch file read back in Python", tensors, metadata, expected)
    print(f"wrote {os.path.relpath(OUT, ROOT)} ({os.path.getsize(OUT)} bytes)")

    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "io_c_writer")
        cmd = ["cc", "-std=c11", "-O1", "-I", os.path.join(ROOT, "include"),
               os.path.join(HERE, "io_c_writer.c"), os.path.join(args.build, "libattograd.a"),
               "-lopenblas", "-lm", "-lpthread", "-o", exe]
        subprocess.run(cmd, check=True)
        c_file = os.path.join(tmp, "from_c.safetensors")
        subprocess.run([exe, c_file], check=True)
        tensors, metadata = sio.load(c_file, torch=True)
        ok &= check_set("attograd file read in Python", tensors, metadata, expected)
        with open(c_file, "rb") as f, open(OUT, "rb") as g:
            identical = f.read() == g.read()
        print(f"attograd file byte-identical to the PyTorch file: {identical}")
        ok &= identical
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
