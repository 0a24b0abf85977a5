"""A reversible tokenizer for the embedded models: `decode(encode(text)) == text` for any text.

Token 0 is end-of-sequence (it decodes to nothing). With a vocabulary of at least 257 tokens, ids
1..256 are the 256 bytes and the rest are pseudo-words (" ka", " tomi", ...: a space then consonant-
vowel syllables), so generated text reads as words. Encoding maps a space-word that is in the
vocabulary to its id and everything else to bytes. Smaller vocabularies (the distribution-test
presets) write each byte as k base-(V-1) digits, ids 1..V-1. `hf_tokenizer.py` writes the byte-level
tokenizer as a Hugging Face tokenizer folder that encodes and decodes identically.
"""

from __future__ import annotations

import re
from typing import Protocol

EOS_ID = 0
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
SYLLABLES = [c + v for c in CONSONANTS for v in VOWELS]  # 70
_SYLLABLE_INDEX = {s: i for i, s in enumerate(SYLLABLES)}
# A space then lowercase ASCII letters, or any one character. Written without '.' and DOTALL so that the
# same pattern means the same in the tokenizers library's regex engine (hf_tokenizer.py).
PIECE_PATTERN = r" [a-z]+|[\s\S]"
_PIECES = re.compile(PIECE_PATTERN)
BYTE_TOKENS = 256
FIRST_WORD_ID = 1 + BYTE_TOKENS


def _word_counts(n_words: int) -> list[int]:
    """How many words of 1, 2, ... syllables the vocabulary holds (shortest first)."""
    counts, left, length = [], n_words, 1
    while left > 0:
        counts.append(min(left, len(SYLLABLES) ** length))
        left -= counts[-1]
        length += 1
    return counts


def render_chat(messages: list[dict[str, str]]) -> str:
    """The embedded models' chat template: '<|role|>\\ncontent\\n' per message, then '<|assistant|>\\n'
    (hf_tokenizer.CHAT_TEMPLATE renders the same)."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


class TextDecoder(Protocol):
    """The cumulative text of the ids fed so far."""

    def feed_one(self, token_id: int) -> None: ...

    def text(self) -> str: ...

    def tail_text(self, num_bytes: int) -> str: ...


class TextTokenizer(Protocol):
    """What requests and the HTTP layer need of a tokenizer (the embedded one, or a real model's)."""

    vocab_size: int
    eos_id: int
    eos_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def check_ids(self, ids: list[int]) -> None: ...

    def stream_decoder(self) -> TextDecoder: ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> str: ...


class Tokenizer:
    """Text <-> token ids over a vocabulary of `vocab_size` (>= 3) ids; see the module docstring."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 3:
            raise ValueError(f"vocab_size {vocab_size} must be >= 3")
        self.vocab_size = vocab_size
        self.eos_id = EOS_ID
        self.eos_ids = frozenset((EOS_ID,))
        self.byte_level = vocab_size >= FIRST_WORD_ID
        self._word_counts = _word_counts(vocab_size - FIRST_WORD_ID) if self.byte_level else []
        self._base = vocab_size - 1  # digit mode: ids 1..V-1 are the digits 0..V-2
        self._digits_per_byte = 1
        while self._base**self._digits_per_byte < BYTE_TOKENS:
            self._digits_per_byte += 1

    # --------------------------------------------------------------- words

    def word(self, token_id: int) -> str:
        """The text of word token `token_id` (>= 257), e.g. ' tomi'."""
        n = token_id - FIRST_WORD_ID
        for length, count in enumerate(self._word_counts, start=1):
            if n < count:
                syllables = []
                for _ in range(length):
                    n, r = divmod(n, len(SYLLABLES))
                    syllables.append(SYLLABLES[r])
                return " " + "".join(reversed(syllables))
            n -= count
        raise ValueError(f"token {token_id} is outside the vocabulary of {self.vocab_size}")

    def _word_id(self, piece: str) -> int | None:
        """The id of ' word' if it is in the vocabulary, else None."""
        body = piece[1:]
        if len(body) % 2:
            return None
        n = 0
        for i in range(0, len(body), 2):
            s = _SYLLABLE_INDEX.get(body[i : i + 2])
            if s is None:
                return None
            n = n * len(SYLLABLES) + s
        length = len(body) // 2
        if length > len(self._word_counts) or n >= self._word_counts[length - 1]:
            return None
        return FIRST_WORD_ID + sum(self._word_counts[: length - 1]) + n

    # --------------------------------------------------------------- encode / decode

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (raises UnicodeEncodeError for lone surrogates)."""
        if not self.byte_level:
            return [d for b in text.encode("utf-8") for d in self._byte_digits(b)]
        ids: list[int] = []
        for match in _PIECES.finditer(text):
            piece = match.group()
            word = self._word_id(piece) if len(piece) > 1 else None
            if word is not None:
                ids.append(word)
            else:
                ids.extend(1 + b for b in piece.encode("utf-8"))
        return ids

    def _byte_digits(self, b: int) -> list[int]:
        digits = []
        for _ in range(self._digits_per_byte):
            b, r = divmod(b, self._base)
            digits.append(1 + r)
        return digits[::-1]

    def piece_bytes(self, token_id: int) -> bytes:
        """The bytes of one token in byte-level mode (EOS: none)."""
        if token_id == EOS_ID:
            return b""
        if token_id < FIRST_WORD_ID:
            return bytes((token_id - 1,))
        return self.word(token_id).encode("ascii")

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD, EOS decodes to nothing."""
        decoder = StreamDecoder(self)
        decoder.feed(ids)
        return decoder.text()

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return render_chat(messages)

    def check_ids(self, ids: list[int]) -> None:
        """ValueError unless every id is an int in [0, V)."""
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size:
                raise ValueError(f"token id {t!r} is outside the vocabulary [0, {self.vocab_size})")


class StreamDecoder:
    """Incremental detokenizer: feed ids as they are generated, read the cumulative text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._bytes = bytearray()
        self._digits: list[int] = []  # digit mode: the current incomplete byte

    def feed(self, ids: list[int]) -> None:
        for t in ids:
            self.feed_one(t)

    def feed_one(self, token_id: int) -> None:
        if self._tok.byte_level:
            self._bytes += self._tok.piece_bytes(token_id)
            return
        if token_id == EOS_ID:
            return
        self._digits.append(token_id - 1)
        if len(self._digits) == self._tok._digits_per_byte:
            value = 0
            for d in self._digits:
                value = value * self._tok._base + d
            self._digits.clear()
            if value < BYTE_TOKENS:
                self._bytes.append(value)

    @property
    def num_bytes(self) -> int:
        return len(self._bytes)

    def text(self) -> str:
        return self._bytes.decode("utf-8", errors="replace")

    def tail_text(self, num_bytes: int) -> str:
        """The text of the last `num_bytes` bytes (partial characters dropped)."""
        return bytes(self._bytes[-num_bytes:]).decode("utf-8", errors="ignore")
