"""The published tokenizer folder, loaded offline by transformers, tokenizes exactly as the engine.

Runs in the conformance environment (transformers and tokenizers pinned beside SGLang), where
SGLang's benchmark client loads it (`AutoTokenizer.from_pretrained(tokenizer_path)`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from serverutil import engine_server, get_json, post_json
from sglang_support import import_sglang

from harness.engine.hf_tokenizer import publish_tokenizer
from harness.engine.openai_api import apply_chat_template
from harness.engine.tokenizer import EOS_ID, FIRST_WORD_ID, Tokenizer

pytestmark = pytest.mark.sglang

VOCABS = {"embedded:mini": 2048, "embedded:small": 32000}
FIXED_TEXTS = [
    "",
    " ",
    "  ",
    "hello world",
    " ka",
    " ka tomi bu",
    " tomix",
    " tom",
    " t",
    " kakakakaka",
    "kaka",
    " Tomi",
    " KA",
    " ka1",
    "2^10 = 1024",
    "007",
    "line\nbreak\ttab\r\n",
    "\n\n\n",
    " \n ka",
    "\t ka",
    "é",
    "e\u0301",
    "\u0301",
    " \u0301ka",
    "中文 ka 漢字",
    "😀",
    "👩‍👩‍👧",
    "👍🏽",
    "\U0010ffff",
    "\x00",
    "\x7f",
    "\x85",
    "\u2028",
    "\u00a0ka",
    "<|endoftext|>",
    "a<|endoftext|>b",
    "<|user|>",
    "<0x41>",
    "Ġka",
    "ĠĠ",
    " ka . tomi , bu 's n't ",
    "ka-ka_ka",
    "Find x such that 2^x = 1024.\n\\boxed{10}",
]
ALPHABETS = [
    " ",
    " ",
    "\n",
    "\t",
    "abcdefghijklmnopqrstuvwxyz",
    "ABCXYZ",
    "0123456789",
    ".,;:!?'\"-()[]{}",
    "éüßçñø",
    "中文字漢",
    "😀🚀✓—",
    "\u0301\u0308",
    "\u200d\ufeff\u2028",
]


def random_texts(tok: Tokenizer, n: int, seed: int) -> list[str]:
    """Mixtures of vocabulary words, syllable runs that are not words, and characters of many scripts."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(1, 12)):
            kind = rng.randrange(4)
            if kind == 0:
                parts.append(tok.word(rng.randrange(FIRST_WORD_ID, tok.vocab_size)))
            elif kind == 1:
                parts.append(
                    " " * rng.randrange(2)
                    + "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randrange(1, 5)))
                    + rng.choice(["", "", "x", "a"])
                )
            elif kind == 2:
                parts.append("".join(rng.choice(rng.choice(ALPHABETS)) for _ in range(rng.randrange(1, 6))))
            else:
                parts.append(chr(rng.choice([rng.randrange(0x20, 0xD800), rng.randrange(0xE000, 0x110000)])))
        texts.append("".join(parts))
    return texts


@pytest.fixture(scope="module")
def transformers():
    return import_sglang("transformers")


@pytest.fixture(scope="module", params=sorted(VOCABS))
def pair(request, tmp_path_factory, transformers):
    """(engine tokenizer, transformers tokenizer loaded offline from the published folder)."""
    tok = Tokenizer(VOCABS[request.param])
    root = tmp_path_factory.mktemp("cache")
    folder = publish_tokenizer(tok, 65536, request.param.split(":")[1], {"XDG_CACHE_HOME": str(root)})
    return tok, transformers.AutoTokenizer.from_pretrained(str(folder))  # a local folder: no hub access


def test_encode_and_decode_match_the_engine(pair) -> None:
    tok, hf = pair
    texts = FIXED_TEXTS + random_texts(tok, 3000, seed=tok.vocab_size)
    for text in texts:
        ids = tok.encode(text)
        assert hf.encode(text) == ids, text  # add_special_tokens=True (the default) adds nothing
        assert hf(text, add_special_tokens=False)["input_ids"] == ids, text
        assert hf.decode(ids) == text, text


def test_decode_of_any_ids_matches_the_engine(pair) -> None:
    """Random ids include EOS and runs of bytes that are not valid UTF-8 (replaced the same way)."""
    tok, hf = pair
    rng = random.Random(1)
    for _ in range(3000):
        ids = [
            rng.choice([rng.randrange(tok.vocab_size), rng.randrange(1, 257), EOS_ID])
            for _ in range(rng.randrange(1, 40))
        ]
        assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids), ids
    assert hf.decode([EOS_ID, 105]) == "<|endoftext|>h"  # shown unless skipped, as any special token


def test_special_tokens_and_sizes(pair) -> None:
    tok, hf = pair
    assert hf.eos_token_id == EOS_ID and hf.num_special_tokens_to_add() == 0
    assert hf.vocab_size == len(hf) == tok.vocab_size and hf.model_max_length == 65536
    assert hf.convert_ids_to_tokens([EOS_ID, 1 + ord("a"), FIRST_WORD_ID]) == ["<|endoftext|>", "a", "Ġba"]


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "é 中 😀\n"},
    ],
    [
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": " b"}]},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": ""},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_renders_as_the_chat_route(pair, messages) -> None:
    tok, hf = pair
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == apply_chat_template(messages)
    assert hf.encode(rendered) == tok.encode(apply_chat_template(messages))


@pytest.mark.slow
def test_server_prompt_tokens_equal_the_published_tokenizer(tmp_path: Path, transformers) -> None:
    """The server's own folder (from /model_info) counts every prompt as the server does."""
    env = {"XDG_CACHE_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    with engine_server(["--model-path", "embedded:mini"], env=env) as server:
        folder = get_json(server.url + "/model_info")["tokenizer_path"]
        assert Path(folder).parent == tmp_path / "specbench" / "tokenizers"
        hf = transformers.AutoTokenizer.from_pretrained(folder)
        texts = [t for t in FIXED_TEXTS + random_texts(Tokenizer(2048), 200, seed=5) if t]
        status, replies = post_json(server.url + "/generate", {"text": texts, "sampling_params": {"max_new_tokens": 0}})
        assert status == 200, replies
        assert [r["meta_info"]["prompt_tokens"] for r in replies] == [len(hf(t)["input_ids"]) for t in texts]
        status, chat = post_json(server.url + "/v1/chat/completions", {"messages": CONVERSATIONS[1], "max_tokens": 1})
        assert status == 200, chat
        rendered = hf.apply_chat_template(CONVERSATIONS[1], tokenize=False, add_generation_prompt=True)
        assert chat["usage"]["prompt_tokens"] == len(hf.encode(rendered))
