"""A GGUF file as gguf.py reads it: its metadata as Python values and its tensors as numpy
views of the memory-mapped file, nothing copied.

The layout is llama.cpp's (GGUF versions 2 and 3, little-endian): the magic, the version, the
tensor and key-value counts, each key with its typed value (arrays: their element type and
count, then the elements), each tensor's name, dimensions (fastest first), type and offset,
then the tensors' data from the first multiple of `general.alignment` (32 by default) past the
header. The gguf package's reader builds a numpy view for every element of every array, which
took ~8 s for the vocabulary and merges of a 150K-token tokenizer; here an array of numbers is
one view and an array of strings one pass.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
STRING, ARRAY = 8, 9
# value type -> its numpy dtype (little-endian), and its struct format
NUMBERS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
           10: "<u8", 11: "<i8", 12: "<f8"}
FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
# tensor types held as numbers, not blocks: their numpy dtype (the others as bytes)
PLAIN = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "<i1", "I16": "<i2", "I32": "<i4",
         "I64": "<i8"}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: object        # gguf.GGMLQuantizationType
    shape: tuple[int, ...]     # ggml's order: the fastest dimension first
    n_elements: int
    data: np.ndarray           # [..., rows, columns] as numbers, or [..., rows, bytes] as blocks


class _Header:
    """Reads typed values from the header's bytes in order."""

    def __init__(self, buffer: memoryview):
        self.buffer, self.at = buffer, 0

    def number(self, kind: int):
        fmt = FORMATS[kind]
        (value,) = struct.unpack_from(fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.number(10)
        end = self.at + n
        if end > len(self.buffer):
            raise ValueError("a string runs past the end of the file")
        text = str(self.buffer[self.at:end], "utf-8")
        self.at = end
        return text

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            if kind not in FORMATS:
                raise ValueError(f"unknown value type {kind}")
            return self.number(kind)
        inner, count = self.number(4), self.number(10)
        if inner in (STRING, ARRAY):
            return [self.value(inner) for _ in range(count)]
        if inner not in NUMBERS:
            raise ValueError(f"unknown value type {inner}")
        dtype = np.dtype(NUMBERS[inner])
        values = np.frombuffer(self.buffer, dtype, count, self.at).tolist()
        self.at += count * dtype.itemsize
        return values


class GGUFFile:
    """`fields`: every key's value (strings, numbers, lists); `tensors`: GGUFTensor each, in the
    file's order. Raises ValueError for a file that is not a GGUF file it can read."""

    def __init__(self, path: str | Path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        self.data = np.memmap(path, mode="r")
        header = _Header(memoryview(self.data))
        try:
            if bytes(header.buffer[:4]) != MAGIC:
                raise ValueError("GGUF magic invalid")
            header.at = 4
            version = header.number(4)
            if version not in VERSIONS:
                raise ValueError(f"GGUF version {version} is not supported (2 and 3 are; a "
                                 "big-endian file reads as another version)")
            tensor_count, kv_count = header.number(10), header.number(10)
            self.fields: dict[str, object] = {}
            for _ in range(kv_count):
                key = header.string()
                self.fields[key] = header.value(header.number(4))
            infos, names = [], set()
            for _ in range(tensor_count):
                name = header.string()
                if name in names:
                    raise ValueError(f"tensor {name!r} twice")
                names.add(name)
                dims = tuple(header.number(10) for _ in range(header.number(4)))
                infos.append((name, dims, header.number(4), header.number(10)))
        except (IndexError, UnicodeDecodeError, struct.error) as e:
            raise ValueError(f"a damaged header: {e}") from None
        alignment = self.fields.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment!r} is not a power of two")
        start = -(-header.at // alignment) * alignment
        self.tensors: list[GGUFTensor] = []
        for name, dims, kind, offset in infos:
            qtype = GGMLQuantizationType(kind)
            n = int(np.prod(dims, dtype=np.int64))
            rows = tuple(reversed(dims))
            block, size = GGML_QUANT_SIZES[qtype]
            if qtype.name in PLAIN:
                dtype, shape, count = np.dtype(PLAIN[qtype.name]), rows, n
            else:
                dtype, shape, count = np.dtype(np.uint8), quant_shape_to_byte_shape(rows, qtype), \
                    n * size // block
            begin = start + offset
            if begin + count * dtype.itemsize > len(self.data):
                raise ValueError(f"tensor {name!r} runs past the end of the file")
            data = np.frombuffer(self.data, dtype, count, begin).reshape(shape)
            self.tensors.append(GGUFTensor(name, qtype, dims, n, data))
