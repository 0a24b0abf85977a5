"""GGUF files written by hand for the model checks (GGUF's layout, version 3): no `gguf` package needed."""

from __future__ import annotations

import struct
from pathlib import Path


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def tiny_gguf(path: Path) -> Path:
    """A whole GGUF v3 file written by hand (GGUF's layout): an architecture key, a u32 key and an array key,
    an F32 tensor of 64x32 and a Q8_0 tensor of 64 values (2 blocks of 34 bytes), each aligned to 32 bytes."""
    kv = _string("general.architecture") + struct.pack("<I", 8) + _string("llama")
    kv += _string("llama.block_count") + struct.pack("<II", 4, 2)
    kv += _string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 3) + struct.pack("<3f", 0, 1, 2)
    tensors = [("token_embd.weight", (32, 64), 0, 64 * 32 * 4), ("output.weight", (64,), 8, 2 * 34)]
    table, offset = b"", 0
    for name, dims, kind, size in tensors:
        table += _string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        table += struct.pack("<IQ", kind, offset)
        offset += -(-size // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 3) + kv + table
    head += bytes(-len(head) % 32)
    path.write_bytes(head + bytes(offset))
    return path
