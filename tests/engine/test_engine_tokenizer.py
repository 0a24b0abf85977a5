"""The embedded tokenizer is reversible, decodes generated ids to words, and streams incrementally; its
Hugging Face folder (hf_tokenizer) is complete and published once per content."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.engine import hf_tokenizer
from harness.engine.tokenizer import EOS_ID, FIRST_WORD_ID, PIECE_PATTERN, StreamDecoder, Tokenizer

TEXTS = [
    "",
    "hello world",
    " ka tomi bu",
    "Ünïcødé ✓ 🚀 — 漢字",
    "line\nbreak\ttab",
    " ka ka kaka  zzz ",
    "Find x such that 2^x = 1024.\n\\boxed{10}",
]


@pytest.mark.parametrize("vocab", [3, 4, 100, 257, 2048, 32000, 248320])
@pytest.mark.parametrize("text", TEXTS)
def test_decode_inverts_encode(vocab: int, text: str) -> None:
    tok = Tokenizer(vocab)
    ids = tok.encode(text)
    assert all(0 < t < vocab for t in ids)  # EOS never appears in encoded text
    assert tok.decode(ids) == text


def test_word_tokens_decode_to_words_and_encode_back() -> None:
    tok = Tokenizer(32000)
    for token_id in [FIRST_WORD_ID, FIRST_WORD_ID + 69, FIRST_WORD_ID + 70, 5000, 31999]:
        word = tok.word(token_id)
        assert word.startswith(" ") and word[1:].isalpha()
        assert tok.encode(word) == [token_id]
    assert tok.encode(" ka") != tok.encode(" kaq")  # not a word: falls back to bytes
    with pytest.raises(ValueError):
        tok.word(32000)


def test_eos_decodes_to_nothing() -> None:
    for vocab in (4, 2048):
        tok = Tokenizer(vocab)
        ids = tok.encode("ab")
        assert tok.decode([EOS_ID, *ids, EOS_ID]) == "ab"


@pytest.mark.parametrize("vocab", [4, 2048])
def test_stream_decoder_matches_decode_for_any_ids(vocab: int) -> None:
    tok, rng = Tokenizer(vocab), random.Random(0)
    ids = [rng.randrange(vocab) for _ in range(300)]
    dec = StreamDecoder(tok)
    for t in ids:
        dec.feed_one(t)
    assert dec.text() == tok.decode(ids)
    assert isinstance(tok.decode(ids), str)


def test_check_ids_rejects_out_of_range_and_non_ints() -> None:
    tok = Tokenizer(10)
    tok.check_ids([0, 9])
    for bad in ([10], [-1], [True], [1.0]):
        with pytest.raises(ValueError):
            tok.check_ids(bad)


def test_lone_surrogate_cannot_be_encoded() -> None:
    with pytest.raises(UnicodeEncodeError):
        Tokenizer(2048).encode("\ud800")


# ---------------------------------------------------------------------- the Hugging Face folder (hf_tokenizer)
# (that transformers loads it and tokenizes identically is checked in test_sglang_tokenizer.py)


@pytest.mark.parametrize("vocab_size", [257, 2048])
def test_hf_vocabulary_maps_every_id_once(vocab_size: int) -> None:
    tok = Tokenizer(vocab_size)
    vocab = hf_tokenizer.vocabulary(tok)
    assert sorted(vocab.values()) == list(range(vocab_size))
    chars = hf_tokenizer.byte_chars()
    assert len(set(chars)) == 256 and vocab[hf_tokenizer.EOS_TOKEN] == EOS_ID
    assert all(vocab[chars[b]] == 1 + b for b in range(256))
    for token_id in range(FIRST_WORD_ID, vocab_size):
        assert vocab["\u0120" + tok.word(token_id)[1:]] == token_id  # ' tomi' -> 'Ġtomi'


def test_hf_tokenizer_json_uses_the_engine_piece_pattern() -> None:
    tj = hf_tokenizer.tokenizer_json(Tokenizer(300))
    split, byte_level = tj["pre_tokenizer"]["pretokenizers"]
    assert split["pattern"]["Regex"] == PIECE_PATTERN and split["behavior"] == "Isolated"
    assert byte_level["type"] == tj["decoder"]["type"] == "ByteLevel" and tj["post_processor"] is None
    assert tj["model"]["merges"] == [] and tj["model"]["ignore_merges"] is True
    assert tj["added_tokens"] == [
        {
            "id": 0,
            "content": "<|endoftext|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    ]


@pytest.mark.parametrize("vocab_size", [3, 4, 100, 256])
def test_digit_vocabularies_get_no_hf_folder(vocab_size: int, tmp_path) -> None:
    assert hf_tokenizer.tokenizer_files(Tokenizer(vocab_size), 4096) is None
    assert hf_tokenizer.publish_tokenizer(Tokenizer(vocab_size), 4096, "t", {"XDG_CACHE_HOME": str(tmp_path)}) is None
    assert list(tmp_path.iterdir()) == []


def test_cache_root_follows_xdg_then_home(tmp_path) -> None:
    assert hf_tokenizer.cache_root({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/specbench/tokenizers")
    assert hf_tokenizer.cache_root({"HOME": "/h"}) == Path("/h/.cache/specbench/tokenizers")


def test_publish_is_content_addressed_reused_and_repaired(tmp_path) -> None:
    files = hf_tokenizer.tokenizer_files(Tokenizer(600), 4096)
    folder = hf_tokenizer.publish(files, tmp_path, "mini")
    assert folder.parent == tmp_path and folder.name == f"mini-{hf_tokenizer.digest(files)[:16]}"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    assert hf_tokenizer.publish(files, tmp_path, "mini") == folder  # reused, not rewritten
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp
    (folder / "tokenizer.json").write_bytes(b"{")  # a damaged copy is replaced
    assert hf_tokenizer.publish(files, tmp_path, "mini") == folder and hf_tokenizer.holds(folder, files)
    other = hf_tokenizer.publish(hf_tokenizer.tokenizer_files(Tokenizer(601), 4096), tmp_path, "mini")
    assert other != folder
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, other.name])  # no temporaries left
