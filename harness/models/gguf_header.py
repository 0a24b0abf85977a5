"""A GGUF file's header, metadata and tensor table read with the standard library, and the file's size checked
against where its tensors' data must end: a file cut short (`head -c 5M model.gguf`, or its 24-byte header alone)
is found before any server is given it. No tensor data is read; a multi-GB file takes milliseconds.

The layout is GGUF's (versions 2 and 3, little-endian; ggml's docs/gguf.md): magic, version, tensor count and
metadata count; the metadata (key, type, value); the tensor table (name, dimensions, ggml type, offset); then the
data, aligned to `general.alignment` (32 when absent). The bytes per block of each ggml type are ggml's
(ggml.c's type traits, gguf-py's GGML_QUANT_SIZES); a type not listed here is checked by its offset only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# metadata value types: the fixed-size ones by their struct format
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
# ggml type id: (values per block, bytes per block)
BLOCKS = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    30: (1, 2),  # BF16
}
MAX_COUNT = 1 << 24  # more tensors, keys or array items than any model has: a damaged count


class GGUFError(ValueError):
    """The file is not a whole GGUF file; the message says what is wrong."""


@dataclass(frozen=True)
class Header:
    version: int
    tensor_count: int
    metadata: dict[str, object]  # arrays as their length
    data_start: int  # where the tensor data begins
    data_end: int  # where the last tensor's data ends (by its ggml type; by its offset where the type is unknown)


class _Reader:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def take(self, n: int) -> bytes:
        got = self.f.read(n)
        if len(got) != n:
            raise GGUFError(f"the file ends at byte {self.f.tell()}, inside its header (cut short)")
        return got

    def unpack(self, fmt: str) -> object:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def uint(self, fmt: str) -> int:
        """An unsigned integer field (`I`: 32 bits, `Q`: 64 bits)."""
        value = self.unpack(fmt)
        assert isinstance(value, int)
        return value

    def count(self, what: str) -> int:
        n = self.uint("Q")
        if n > MAX_COUNT:
            raise GGUFError(f"{what} {n} is no real count (damaged header)")
        return n

    def string(self) -> str:
        return self.take(self.count("a string length")).decode("utf-8", "replace")

    def value(self, kind: int) -> object:
        if kind in SCALARS:
            return self.unpack(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item = self.uint("I")
            n = self.count("an array length")
            if item in SCALARS:  # fixed size: skipped, not decoded
                self.take(n * struct.calcsize(SCALARS[item]))
            else:
                for _ in range(n):
                    self.value(item)
            return n
        raise GGUFError(f"unknown metadata value type {kind} (damaged header)")


def read_header(f: BinaryIO) -> Header:
    """The header of the GGUF file open in `f`; GGUFError when it is not GGUF or ends early."""
    r = _Reader(f)
    if r.take(len(MAGIC)) != MAGIC:
        raise GGUFError("not a GGUF file (no GGUF magic)")
    version = r.uint("I")
    if version not in (2, 3):
        raise GGUFError(f"GGUF version {version}: only versions 2 and 3 are read")
    n_tensors, n_kv = r.count("the tensor count"), r.count("the metadata count")
    metadata = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.uint("I"))
    end = 0
    for _ in range(n_tensors):
        r.string()
        dims = [r.uint("Q") for _ in range(r.uint("I"))]
        kind, offset = r.uint("I"), r.uint("Q")
        values = 1
        for d in dims:
            values *= d
        per_block, block_bytes = BLOCKS.get(kind, (1, 0))
        end = max(end, offset + -(-values // per_block) * block_bytes)
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))  # type: ignore[call-overload]
    if alignment <= 0:
        raise GGUFError(f"general.alignment {alignment} (damaged header)")
    table_end = f.tell()
    start = -(-table_end // alignment) * alignment
    return Header(version, n_tensors, metadata, start, start + end if n_tensors else table_end)


def check_whole(f: BinaryIO, size: int) -> Header:
    """The header, after checking the file holds all of its tensors' data: GGUFError saying what is missing."""
    header = read_header(f)
    if header.data_end > size:
        raise GGUFError(
            f"the file has {size} bytes but its {header.tensor_count} tensors end at byte {header.data_end} "
            f"(cut short: {header.data_end - size} bytes missing)"
        )
    return header
