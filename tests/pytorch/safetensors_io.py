"""A small, dependency-free reader and writer of the safetensors format.

torch 1.13 on our machines has no `safetensors` package, and the scripts that
write PyTorch reference files for attograd's tests need one. This module
follows the format as the reference implementation (huggingface/safetensors)
writes it, so its output matches that library byte for byte:

    8 bytes   N, little-endian u64
    N bytes   compact UTF-8 JSON: {"__metadata__": {...}, "name": {"dtype": "F32",
              "shape": [...], "data_offsets": [begin, end]}, ...}, padded with
              spaces to a multiple of 8
    the rest  the tensors' bytes, little-endian, row-major

Tensors are ordered by dtype alignment (largest first, in the reference's
Dtype enum order) and then by name; metadata keys are sorted.

    import safetensors_io as sio
    sio.save({"w": torch.randn(4, 8)}, "ref.safetensors", {"format": "pt"})
    tensors, metadata = sio.load("ref.safetensors")             # numpy arrays
    tensors, metadata = sio.load("ref.safetensors", torch=True)  # torch tensors

Needs numpy; torch only for torch tensors. Run by hand, never by CI.
"""
import json
import struct

import numpy as np

# The reference implementation's Dtype enum, in its order (increasing
# alignment); files sort tensors by this, descending, then by name.
DTYPE_ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
               "BF16", "I32", "U32", "F32", "F64", "I64", "U64"]

NUMPY_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
    "U16": np.uint16, "F16": np.float16, "I32": np.int32, "U32": np.uint32,
    "F32": np.float32, "F64": np.float64, "I64": np.int64, "U64": np.uint64,
}

MAX_HEADER = 100_000_000


def _dtype_name(array):
    for name, dt in NUMPY_DTYPES.items():
        if array.dtype == np.dtype(dt):
            return name
    raise TypeError(f"dtype {array.dtype} has no safetensors name here")


def _as_numpy(value):
    """A C-contiguous numpy array from a torch tensor or anything numpy takes."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().contiguous().numpy()
    return np.asarray(value, order="C")  # not ascontiguousarray: it makes scalars 1-D


def _little_endian_bytes(array):
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and
                                        np.little_endian is False):
        array = array.byteswap()
    return array.tobytes()


def dumps(tensors, metadata=None):
    """The file's bytes for {name: tensor}, with optional {str: str} metadata."""
    entries = []
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"bad tensor name {name!r}")
        array = _as_numpy(value)
        entries.append((name, _dtype_name(array), array))
    entries.sort(key=lambda e: (-DTYPE_ORDER.index(e[1]), e[0].encode("utf-8")))

    header = {}
    if metadata:
        for key, val in metadata.items():
            if not isinstance(key, str) or not isinstance(val, str):
                raise TypeError("metadata must map strings to strings")
        header["__metadata__"] = {k: metadata[k] for k in
                                  sorted(metadata, key=lambda k: k.encode("utf-8"))}
    offset, chunks = 0, []
    for name, dtype, array in entries:
        data = _little_endian_bytes(array)
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def save(tensors, path, metadata=None):
    with open(path, "wb") as f:
        f.write(dumps(tensors, metadata))


def loads(data, torch=False):
    """(tensors, metadata) from a file's bytes; checks the layout strictly."""
    if len(data) < 8:
        raise ValueError("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or n > len(data) - 8:
        raise ValueError(f"bad header length {n}")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate key in the header")
        return dict(pairs)

    header = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("metadata values must be strings")
    body = data[8 + n:]
    covered, tensors = 0, {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{name}: fields {sorted(info)}")
        begin, end = info["data_offsets"]
        dtype = np.dtype(NUMPY_DTYPES[info["dtype"]]).newbyteorder("<")
        count = int(np.prod(info["shape"], dtype=np.int64))
        if begin != covered or end - begin != count * dtype.itemsize or end > len(body):
            raise ValueError(f"{name}: bad data_offsets {info['data_offsets']}")
        covered = end
        array = np.frombuffer(body, dtype=dtype, count=count, offset=begin)
        array = array.reshape(info["shape"]).astype(dtype.newbyteorder("="))
        tensors[name] = array
    if covered != len(body):
        raise ValueError("data not fully covered by tensors")
    if torch:
        import torch as _torch
        tensors = {k: _torch.from_numpy(v.copy()) for k, v in tensors.items()}
    return tensors, metadata


def load(path, torch=False):
    with open(path, "rb") as f:
        return loads(f.read(), torch=torch)
