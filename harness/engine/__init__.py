"""The embedded reference speculative-decoding server (`python -m harness.engine`).

It speaks SGLang's HTTP protocol and really performs speculative decoding (DFLASH/DSPARK-style block
drafts, token-wise or block verification from `harness.verify`) with a synthetic target and draft
model in torch, so the harness runs end to end without a GPU, a download or a network.

Modules: `args` (flags), `model` and `exact` (the synthetic models),
`tokenizer`, `hf_tokenizer` (the same tokenizer as a Hugging Face folder, for SGLang's bench client),
`params` (request validation), `request` (per-request state), `worker` (one step),
`scheduler` (continuous batching), `service` (what the routes call), `http_api` and `openai_api`
(routes), `logs`, `server` (start-up), `argv_probe` (its parser run on argvs the runner
checks before launch, as a script in the server's interpreter). What `--model-path` names (the presets, the shipped
real models, the real model itself) lives in `harness.models`, shared with the runner and the microbenchmark. Its throughput benchmark is the experiment `embedded_perf` (`make perf`).
"""
