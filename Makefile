# specbench: reproducible A/B benchmarking of speculative decoding.
# `make help` lists the targets. Every target creates .venv on first use.

PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
ARGS    ?=

.DEFAULT_GOAL := help

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	@echo ">> installing torch 2.13.0 (CPU build from local disk) and the project into $(VENV)"
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

.PHONY: help venv test test-fast bench report micro micro-h200 perf lint clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  (pass Hydra overrides with ARGS='key=value ...')"

venv: $(STAMP) ## create .venv and install the project (done by every target on first use)

test: $(STAMP) ## run the whole test suite (what CI runs)
	$(VPY) -m pytest -q $(ARGS)

test-fast: $(STAMP) ## unit tests only (skip the end-to-end ones that start servers)
	$(VPY) -m pytest -q -m "not slow" $(ARGS)

bench: $(STAMP) ## run the default experiment (embedded server) and write its report
	$(VPY) -m harness.bench $(ARGS)

report: $(STAMP) ## regenerate the report of a campaign: make report DIR=results/<exp>/<campaign>
	@test -n "$(DIR)" || { echo "usage: make report DIR=results/<experiment>/<campaign> [ARGS='--strict ...']"; exit 2; }
	$(VPY) -m analysis.report $(DIR) $(ARGS)

micro: $(STAMP) ## time the verify-probability builders (CPU-sized default config)
	$(VPY) -m harness.micro $(ARGS)

micro-h200: $(STAMP) ## the seed-size builder microbenchmark (needs a big GPU)
	$(VPY) -m harness.micro micro=seed_h200 $(ARGS)

perf: $(STAMP) ## embedded server throughput: NONE vs DFLASH token/block at concurrency 1, 8, 32
	$(VPY) -m harness.engine.perf $(ARGS)

lint: $(STAMP) ## ruff
	$(VPY) -m ruff check harness workloads analysis tests

clean: ## remove the virtual environment and caches (keeps results/)
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
