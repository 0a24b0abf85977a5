"""The verify-probability builder microbenchmark (`python -m harness.micro`, `make micro`).

For each logit family, vocabulary, batch size (rows) and implementation (a registry: the project's builders in
`harness.verify` and SGLang's own function through an adapter) it measures the time (median, min,
max), the peak temporary memory on CUDA, the equality with the baseline's output, and a plain device
copy of the logits in the same run as the bandwidth floor. Modules:
- `families`: the logit families (seeded synthetic ones, real rows of the logit bank);
- `bank`: the logit bank (`make logit-bank`: real model logits, run on the CPU);
- `inputs`: per-row sampling parameters and the rotated copies;
- `impls`: the implementation registry and the SGLang adapter;
- `measure`: timers (CUDA events / perf_counter), peak memory, statistics, bandwidth arithmetic;
- `compare`: bitwise / kept-set / value comparison of two outputs, and the rows the rules leave open (ties);
- `report`: results.jsonl, manifest.json, report.md and the console table;
- `app`: the run itself; `__main__`: the Hydra entry point.
"""
