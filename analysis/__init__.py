"""Analysis of campaigns: read the raw records and manifests, audit them, compute the metrics and
their paired statistics, and write report.md with figures.

Modules, one job each: `load` (read files into flat tables), `commands` (command/env diffs between
arms), `audit` (coverage, seeds, commands, server fields, checked metadata, machine load, scores, chunk
timings), `metrics` (point figures: AL, throughputs, TTFT/E2E/ITL/TPOT), `stats` (item bootstrap, t-interval
on pair log ratios, sign-flip test, power), `compare` (changes against the baseline, power table),
`tables` (numeric and display tables), `markdown`, `plots`, `report` (API and CLI),
`bench_report` (timing on 1M synthetic records).
"""
