"""A small reader/writer of the safetensors format, for the PyTorch references in tests/reference.

The format: 8 bytes little-endian unsigned header length N, N bytes of UTF-8 JSON, then the data
region. The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte
offsets into the data region, which the tensors tile without gaps) and may hold "__metadata__", a
map of strings to strings. The header is padded with spaces so that the data region starts on an
8-byte boundary. Tensors are stored row-major, little-endian.

As the safetensors library writes a file: the tensors are laid out in the data region by
descending element size, then by name, and the header lists them in that order after
"__metadata__". Reading accepts any order.

Only this machine's byte order is handled (little-endian, checked).
"""
import json
import struct
import sys

import torch

# safetensors dtype name <-> torch dtype
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}

if sys.byteorder != "little":
    raise RuntimeError("safetensors_io handles little-endian machines only")


class SafetensorsError(ValueError):
    pass


def tensor_bytes(t):
    """The raw little-endian bytes of a tensor, row-major."""
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return b""
    return t.view(-1).view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(buf, dtype, shape):
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(buf), dtype=dtype).reshape(shape).clone()


def dumps(tensors, metadata=None):
    """The bytes of a safetensors file holding `tensors` (name -> tensor)."""
    for name, t in tensors.items():
        if t.dtype not in NAMES:
            raise SafetensorsError(f"{name}: dtype {t.dtype} is not supported")
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header = {}
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    chunks = []
    offset = 0
    for name in order:
        t = tensors[name]
        b = tensor_bytes(t)
        header[name] = {
            "dtype": NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        chunks.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def save(path, tensors, metadata=None):
    data = dumps(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def parse_header(data, path="<bytes>"):
    """(header dict, data region start) of a safetensors file's bytes; checks the layout."""
    if len(data) < 8:
        raise SafetensorsError(f"{path}: {len(data)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise SafetensorsError(f"{path}: header length {n} runs past the end of the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    start = 8 + n
    region = len(data) - start
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = info["dtype"]
            shape = info["shape"]
            b, e = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor {name}: malformed entry {info!r}") from None
        if dtype not in DTYPES:
            raise SafetensorsError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        numel = 1
        for s in shape:
            numel *= s
        size = numel * torch.empty((), dtype=DTYPES[dtype]).element_size()
        if not (0 <= b <= e <= region) or e - b != size:
            raise SafetensorsError(
                f"{path}: tensor {name}: data_offsets [{b}, {e}] do not fit shape {shape} {dtype} "
                f"({size} bytes) in a data region of {region} bytes")
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            raise SafetensorsError(f"{path}: tensor {name} starts at {b}, expected {pos} (gap or overlap)")
        pos = e
    if pos != region:
        raise SafetensorsError(f"{path}: tensors end at {pos} but the data region has {region} bytes")
    return header, start


def loads(data, path="<bytes>"):
    """(tensors name -> tensor in the file's dtype, metadata dict or None)."""
    header, start = parse_header(data, path)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = tensor_from_bytes(data[start + b:start + e], DTYPES[info["dtype"]], info["shape"])
    return out, header.get("__metadata__")


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    return loads(data, path)


def raw_tensors(path):
    """name -> (dtype name, shape, raw bytes) without converting, for byte-exact comparisons."""
    with open(path, "rb") as f:
        data = f.read()
    header, start = parse_header(data, path)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), data[start + b:start + e])
    return out
