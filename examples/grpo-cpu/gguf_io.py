"""Read and write GGUF files (version 3) with numpy alone.

Debian bookworm, where this example runs, has no python3-gguf (it starts
in trixie), so this module implements the small part of the format the
trainer needs: the header, every metadata key with its exact value type
(kept in file order, so a file read and written back is byte-identical),
the tensor directory and float32 tensor data. Tensors of other types are
carried as raw bytes and written back unchanged.

Layout (little-endian): magic "GGUF", version u32, tensor count u64,
metadata count u64; each metadata entry is a string key, a u32 value type
and the value (arrays: element type u32, count u64, elements); each tensor
entry is a string name, n_dims u32, the dimensions as u64 from the fastest
varying one (ggml's ne order, so numpy's shape is their reverse), the ggml
type u32 and the data offset u64, relative to the data section. The data
section starts at the next multiple of general.alignment (default 32) after
the directory, and every tensor's data is padded to that alignment.
"""

import struct

import numpy as np

MAGIC = b"GGUF"
VERSION = 3
DEFAULT_ALIGNMENT = 32

# Metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}

# ggml tensor types this module understands as arrays; others stay raw.
GGML_F32 = 0
GGML_F16 = 1


class GGUFError(ValueError):
    """A file that is not a GGUF file this module can read."""


class Tensor:
    """One tensor: name, numpy shape (the reverse of ggml's ne), ggml type
    and data (a float32 array for F32, raw bytes otherwise)."""

    def __init__(self, name, shape, ggml_type, data):
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.ggml_type = ggml_type
        self.data = data

    def nbytes(self):
        if isinstance(self.data, np.ndarray):
            return self.data.nbytes
        return len(self.data)


class GGUFFile:
    """Metadata (an ordered list of (key, value type, value, element type
    for arrays)) and tensors (ordered) of one GGUF file."""

    def __init__(self, metadata, tensors):
        self.metadata = metadata
        self.tensors = tensors

    def get(self, key, default=None):
        for k, _, v, _ in self.metadata:
            if k == key:
                return v
        return default

    def arch(self):
        a = self.get("general.architecture")
        if a is None:
            raise GGUFError("general.architecture is missing")
        return a

    def alignment(self):
        return int(self.get("general.alignment", DEFAULT_ALIGNMENT))

    def tensor(self, name):
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError("tensor %s not in the file" % name)


class _Reader:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise GGUFError("truncated file: need %d bytes at offset %d of %d" % (n, self.pos, len(self.buf)))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))[0]

    def string(self):
        n = self.unpack("<Q")
        return bytes(self.take(n)).decode("utf-8")

    def value(self, vtype):
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype]), None
        if vtype == STRING:
            return self.string(), None
        if vtype == ARRAY:
            etype = self.unpack("<I")
            n = self.unpack("<Q")
            if etype == ARRAY:
                raise GGUFError("nested arrays are not supported")
            if etype in _SCALAR:
                fmt = _SCALAR[etype]
                size = struct.calcsize(fmt)
                raw = self.take(size * n)
                return list(struct.unpack("<%d%s" % (n, fmt[1:]), raw)), etype
            if etype == STRING:
                return [self.string() for _ in range(n)], etype
            raise GGUFError("unknown array element type %d" % etype)
        raise GGUFError("unknown metadata value type %d" % vtype)


def read(path):
    """Reads a whole GGUF file."""
    with open(path, "rb") as f:
        buf = memoryview(f.read())
    r = _Reader(buf)
    if bytes(r.take(4)) != MAGIC:
        raise GGUFError("%s: not a GGUF file (bad magic)" % path)
    version = r.unpack("<I")
    if version != VERSION:
        raise GGUFError("%s: GGUF version %d, this reader handles %d" % (path, version, VERSION))
    n_tensors = r.unpack("<Q")
    n_kv = r.unpack("<Q")
    metadata = []
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I")
        value, etype = r.value(vtype)
        metadata.append((key, vtype, value, etype))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I")
        ne = [r.unpack("<Q") for _ in range(n_dims)]
        ggml_type = r.unpack("<I")
        offset = r.unpack("<Q")
        infos.append((name, tuple(reversed(ne)), ggml_type, offset))
    g = GGUFFile(metadata, [])
    align = g.alignment()
    data_start = _pad(r.pos, align)
    ends = sorted(off for _, _, _, off in infos)[1:] + [len(buf) - data_start]
    end_of = dict(zip(sorted(off for _, _, _, off in infos), ends))
    for name, shape, ggml_type, offset in infos:
        start = data_start + offset
        if ggml_type == GGML_F32:
            n = int(np.prod(shape)) if shape else 1
            if start + 4 * n > len(buf):
                raise GGUFError("%s: tensor %s runs past the end of the file" % (path, name))
            data = np.frombuffer(buf, dtype="<f4", count=n, offset=start).reshape(shape).copy()
        else:
            # Raw: up to the next tensor (padding included, trimmed on write
            # only by the caller that knows the type's size).
            data = bytes(buf[start:data_start + end_of[offset]])
        g.tensors.append(Tensor(name, shape, ggml_type, data))
    return g


def _pad(n, align):
    return (n + align - 1) // align * align


def _pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value, etype):
    if vtype in _SCALAR:
        return struct.pack(_SCALAR[vtype], value)
    if vtype == STRING:
        return _pack_string(value)
    if vtype == ARRAY:
        out = [struct.pack("<IQ", etype, len(value))]
        if etype in _SCALAR:
            out.append(struct.pack("<%d%s" % (len(value), _SCALAR[etype][1:]), *value))
        elif etype == STRING:
            out.extend(_pack_string(s) for s in value)
        else:
            raise GGUFError("cannot write array element type %d" % etype)
        return b"".join(out)
    raise GGUFError("cannot write metadata value type %d" % vtype)


def write(path, g):
    """Writes g to path (the caller renames into place for atomicity).
    F32 tensors must be float32 arrays of their recorded shape."""
    align = g.alignment()
    head = [MAGIC, struct.pack("<IQQ", VERSION, len(g.tensors), len(g.metadata))]
    for key, vtype, value, etype in g.metadata:
        head.append(_pack_string(key) + struct.pack("<I", vtype) + _pack_value(vtype, value, etype))
    offset = 0
    blobs = []
    for t in g.tensors:
        if t.ggml_type == GGML_F32:
            arr = np.ascontiguousarray(t.data, dtype="<f4")
            if arr.shape != t.shape:
                raise GGUFError("tensor %s: data shape %s, recorded shape %s" % (t.name, arr.shape, t.shape))
            blob = arr.tobytes()
        else:
            blob = bytes(t.data)
        ne = list(reversed(t.shape))
        head.append(_pack_string(t.name) + struct.pack("<I", len(ne)) +
                    struct.pack("<%dQ" % len(ne), *ne) + struct.pack("<IQ", t.ggml_type, offset))
        padded = _pad(len(blob), align)
        blobs.append(blob + b"\0" * (padded - len(blob)))
        offset += padded
    header = b"".join(head)
    with open(path, "wb") as f:
        f.write(header)
        f.write(b"\0" * (_pad(len(header), align) - len(header)))
        for b in blobs:
            f.write(b)
