"""The embedded tokenizer is reversible, decodes generated ids to words, and streams incrementally."""

from __future__ import annotations

import random

import pytest

from harness.engine.tokenizer import EOS_ID, FIRST_WORD_ID, StreamDecoder, Tokenizer

TEXTS = ["", "hello world", " ka tomi bu", "Ünïcødé ✓ 🚀 — 漢字", "line\nbreak\ttab", " ka ka kaka  zzz ",
         "Find x such that 2^x = 1024.\n\\boxed{10}"]


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
