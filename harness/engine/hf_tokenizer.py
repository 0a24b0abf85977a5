"""A Hugging Face tokenizer folder that tokenizes exactly as `harness.engine.tokenizer.Tokenizer`.

Clients that count tokens themselves (SGLang's `sglang.benchmark.serving` loads the tokenizer named
by `/model_info`'s `tokenizer_path`) load it offline with `transformers.AutoTokenizer.from_pretrained`.
The files are plain JSON written here; the engine needs neither `tokenizers` nor `transformers`.

`tokenizer.json`:
- no normalizer; pre-tokenizer: Split on the engine's pieces (` [a-z]+` or any one character,
  `Isolated`), then ByteLevel without its own regex, which writes each piece's UTF-8 bytes as GPT-2
  byte characters (' ' -> 'Ġ');
- model: BPE without merges and with `ignore_merges`: a piece that is a vocabulary word (' tomi' ->
  'Ġtomi') is that word's id, any other piece falls apart into its bytes, ids 1 + byte;
  end-of-sequence is id 0;
- decoder: ByteLevel, which turns the ids back into bytes and decodes them once, invalid UTF-8 ->
  U+FFFD per maximal invalid subsequence, as the engine's `bytes.decode(errors="replace")`.
  (A byte-fallback model with the ByteFallback decoder would not match: that decoder replaces every
  byte of an invalid run with its own U+FFFD.)
- no post-processor: nothing is added to an encoding.
`tokenizer_config.json`: `PreTrainedTokenizerFast`, the end-of-sequence token, `split_special_tokens`
(a literal '<|endoftext|>' in a text is bytes, as in the engine) and the chat route's template.

Vocabularies under 257 ids (`embedded:tiny`, small `--vocab-size`) write each byte as several digit
tokens, which a BPE model cannot express: they get no folder (`tokenizer_files` returns None).

The folder is content-addressed (`<stem>-<sha256 prefix>` under the cache root), written to a
temporary sibling and renamed into place, and reused when it already holds the same files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.engine.tokenizer import FIRST_WORD_ID, PIECE_PATTERN, Tokenizer

EOS_TOKEN = "<|endoftext|>"
# Renders messages as openai_api.apply_chat_template does (a test checks it with transformers).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}{{- part['text'] -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte (ByteLevel's alphabet): index = byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary(tokenizer: Tokenizer) -> dict[str, int]:
    """Token string -> id, ids 0..V-1 in order: EOS, the 256 bytes, then the words."""
    chars = byte_chars()
    vocab = {EOS_TOKEN: tokenizer.eos_id}
    vocab.update({chars[b]: 1 + b for b in range(256)})
    for token_id in range(FIRST_WORD_ID, tokenizer.vocab_size):
        vocab["".join(chars[b] for b in tokenizer.word(token_id).encode("ascii"))] = token_id
    return vocab


def tokenizer_json(tokenizer: Tokenizer) -> dict:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    split = {"type": "Split", "pattern": {"Regex": PIECE_PATTERN}, "behavior": "Isolated", "invert": False}
    eos = {
        "id": tokenizer.eos_id,
        "content": EOS_TOKEN,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    model: dict[str, Any] = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": True,
        "vocab": vocabulary(tokenizer),
        "merges": [],
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [eos],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
        "post_processor": None,
        "decoder": byte_level,
        "model": model,
    }


def tokenizer_config(context_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "model_max_length": context_length,
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }


def tokenizer_files(tokenizer: Tokenizer, context_length: int) -> dict[str, bytes] | None:
    """File name -> content of the folder; None when the vocabulary uses the digit encoding."""
    if not tokenizer.byte_level:
        return None
    return {
        "tokenizer.json": _dump(tokenizer_json(tokenizer)),
        "tokenizer_config.json": _dump(tokenizer_config(context_length)),
    }


def _dump(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, indent=None, separators=(",", ":")).encode("utf-8")


# ---------------------------------------------------------------------- publishing


def cache_root(env: Mapping[str, str]) -> Path:
    """$XDG_CACHE_HOME/specbench/tokenizers, else ~/.cache/specbench/tokenizers."""
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "specbench" / "tokenizers"


def digest(files: Mapping[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def holds(folder: Path, files: Mapping[str, bytes]) -> bool:
    """True when `folder` has exactly these files with these contents."""
    try:
        names = {p.name for p in folder.iterdir()}
        return names == set(files) and all((folder / n).read_bytes() == data for n, data in files.items())
    except OSError:
        return False


def publish(files: Mapping[str, bytes], root: Path, stem: str) -> Path:
    """`root/<stem>-<digest>` holding `files`: reused if complete, else written whole and renamed in."""
    final = root / f"{stem}-{digest(files)[:16]}"
    if holds(final, files):
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        if final.exists():  # incomplete or damaged: replace it
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not holds(final, files):  # not another process that won the race with the same files
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def publish_tokenizer(tokenizer: Tokenizer, context_length: int, stem: str, env: Mapping[str, str]) -> Path | None:
    """Write (or reuse) the folder for `tokenizer` under the cache root; None for digit vocabularies."""
    files = tokenizer_files(tokenizer, context_length)
    if files is None:
        return None
    return publish(files, cache_root(env), stem)
