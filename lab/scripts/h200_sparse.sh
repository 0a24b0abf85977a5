#!/usr/bin/env bash
# The sparse verify path on a lent GPU host (README "The sparse verify path"): the GPU tests of the kernels, the
# verify-step microbenchmark on every logit family, and the embedded A/B of dense vs sparse.
#
#   lab/scripts/h200_sparse.sh [tests] [micro] [queued] [odd] [builders] [profile] [probe] [tune] [tune_dense]
#                          [step_tune] [step_profile] [dense_profile] [fixed] [fixed_queued] [ab] [publish]
#                                                                              (default: tests micro ab)
#
# One command makes a published set (results/published/verify-h100-20261206-issue55 is one): what it leaves in OUT
# goes to results/published/<set>/, but its logs other than gpu_tests.log to lab/results/<set>/ (the lab notebook):
#   OUT=DIR COMMIT=<sha> lab/scripts/h200_sparse.sh publish
# `publish` is the steps tests micro queued odd builders fixed fixed_queued step_profile dense_profile ab (about 13
# minutes on an H100, 2026-12-06: over one lent call's 10, so split it across two calls, e.g.
# `tests micro queued odd builders` then `fixed fixed_queued step_profile dense_profile ab`), plus manifest.txt: the
# date, COMMIT (default: git rev-parse HEAD, else "unknown"), the command, its steps and the ones that failed.
#
# That host has torch, Triton and CUDA but no network: what the harness needs beyond its image travels as
# wheels (WHEELS, default .whl: hydra-core, omegaconf, antlr4, math-verify, latex2sympy2-extended, orjson, dill,
# rich), FlashInfer as ../shared/gpu's wheels with its top-k module (FLASHINFER, default .gpuk). Results go to
# OUT: gpu.txt, gpu_tests.log, verify-step/{report.md,results.jsonl}, verify-probs/ (`builders`: the dense
# builders' seed-size set, `python -m harness.micro micro=seed_h200`, every family), profile_sparse.log (lab/scripts/
# profile_sparse_step.py: the step's time per kernel), probe_read_shape.log (lab/scripts/probe_read_shape.py: the
# pass's grid shape against bare Triton reads), tune_sparse_pass.log (lab/scripts/tune_sparse_pass.py with the
# configurations TUNE_CONFIGS on TUNE_FAMILIES, into TUNE_LOG; QUEUED_MS=1 times each call queued behind GPU
# work), tuning.log (`tune_dense`: the dense builder's variants against the copy floor, lab/scripts/tune_topk_fused.py, at
# DENSE_VOCABS, default the six of the microbenchmark and 98,304; QUEUED_MS as for `tune`), tune_sparse_step_*.log
# (`step_tune`: the whole step's variants, lab/scripts/tune_sparse_step.py, the large and the small vocabularies
# apart), profile_sparse_step.log (`step_profile`: the step's host and GPU time from a trace,
# lab/scripts/profile_sparse_step.py), fixed_cost.log (`fixed`: lab/scripts/fixed_cost.py), ab-console.log, ab.tgz (the
# campaign). `queued` is `micro` timed the engine's way, each call queued behind a GPU busy-wait of QUEUED_MS (default
# 1) ms (the host's launches hidden behind GPU work as behind the target's forward; no host synchronisation in the
# step), into verify-step-queued/; `odd` reruns ODD_FAMILIES (default iid,gemma3,clustered) at 128,256 and 32,000,
# each cell ODD_REPEATS (default 3) times in one run, idle and queued (verify-step-odd/, verify-step-odd-queued/);
# `fixed_queued` is `fixed` queued (fixed_cost_queued.log); `dense_profile` is lab/scripts/profile_topk_fused.py at
# DENSE_PROFILE_VOCABS (default 32000,49152: the dense builder's kernels and host wait, profile.log).
# A step that fails does not stop the later ones; the script then names the failed steps and exits 1.
# The device's carry limit (64 MiB) counts the tracked tree too: with it at 13.2 MB (2026-12-04) the device refused
# .whl + .gpuk together when .gpuk held FlashInfer's whole wheel; lab/scripts/pack_device_wheels.sh packs both small
# enough to travel together (~28 MB). Otherwise carry .gpuk and a smaller wheel folder (WHEELS=it) holding what the
# steps import:
# `micro` needs dill (its import chain), `builders` hydra-core, omegaconf, antlr4 and dill (tune_topk_fused.py ran
# with none of them); `ab` needs them all but not FlashInfer (topk_first falls back to torch's top-k without it).
# Environment: VOCABS (default the six: 32000,49152,128256,151936,248320,262144), FAMILIES (default all ten), PY
# (default python3).
set -euo pipefail
OUT=${OUT:?set OUT to the folder that receives the results}
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
FLASHINFER=${FLASHINFER:-.gpuk}
FAMILIES=${FAMILIES:-iid,clustered,sorted,heavy_tail,peaked,bf16,padding,lm_like,smollm2,gemma3}
SIX=32000,49152,128256,151936,248320,262144
VOCABS=${VOCABS:-$SIX}
steps=()
for s in "$@"; do
  if [ "$s" = publish ]; then
    steps+=(tests micro queued odd builders fixed fixed_queued step_profile dense_profile ab)
  else steps+=("$s"); fi
done
failed=()  # a step that fails is named at the end and the script exits 1; the later steps still run
[ ${#steps[@]} -eq 0 ] && steps=(tests micro ab)
mkdir -p "$OUT"
{ echo "date $(date -u +%FT%TZ)"; echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "command OUT=$OUT lab/scripts/h200_sparse.sh $*"; echo "steps ${steps[*]}"; } >> "$OUT/manifest.txt"
micro() {  # micro's command into $1, with the extra flags after it
  local dir=$1; shift
  "$PY" -m harness.micro.verify_step --families "${FAMILIES}" --vocabs "$VOCABS" --steps 512 --gamma 7 --repeats 15 \
    --bank tests/fixtures/logit_bank --out "$OUT/$dir" "$@"
}

"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$WHEELS"/*.whl "$FLASHINFER"/*.whl
mkdir -p /tmp/site/flashinfer/data/aot/topk && cp "$FLASHINFER"/flashinfer-aot-sm90a/topk/topk.so /tmp/site/flashinfer/data/aot/topk/
export PYTHONPATH=/tmp/site TVM_FFI_DISABLE_TORCH_C_DLPACK=1 FLASHINFER_DISABLE_JIT=1 PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  "$PY" -c 'import torch, triton, flashinfer; print("torch", torch.__version__, "triton", triton.__version__, "flashinfer", flashinfer.__version__)'
} | tee "$OUT/gpu.txt"

for step in "${steps[@]}"; do
  case "$step" in
    tests)
      "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/verify/test_sparse_kernel.py tests/verify/test_topk_fused.py \
        tests/verify/test_verify_builders.py 2>&1 | tee "$OUT/gpu_tests.log" || failed+=(tests)
      ;;
    micro)
      micro verify-step || failed+=(micro)
      ;;
    queued)
      micro verify-step-queued --queued-ms "${QUEUED_MS:-1}" || failed+=(queued)
      ;;
    odd)  # the same cell ODD_REPEATS times in one run: a vocabulary named again is measured again
      odd=$(printf '128256,%.0s' $(seq "${ODD_REPEATS:-3}"))$(printf '32000,%.0s' $(seq "${ODD_REPEATS:-3}"))
      FAMILIES=${ODD_FAMILIES:-iid,gemma3,clustered} VOCABS=${odd%,} micro verify-step-odd || failed+=(odd)
      FAMILIES=${ODD_FAMILIES:-iid,gemma3,clustered} VOCABS=${odd%,} micro verify-step-odd-queued \
        --queued-ms "${QUEUED_MS:-1}" || failed+=(odd)
      ;;
    builders)
      "$PY" -m harness.micro micro=seed_h200 micro.bank=tests/fixtures/logit_bank "micro.out_dir=$OUT/verify-probs" \
        || failed+=(builders)
      ;;
    profile)
      OUT="$OUT" "$PY" lab/scripts/profile_sparse_step.py || failed+=(profile)
      ;;
    probe)
      OUT="$OUT" "$PY" lab/scripts/probe_read_shape.py || failed+=(probe)
      ;;
    tune_dense)  # `default`: launch_config's table; the others name every key they rely on
      fused='"FUSE": 1, "FINISH_WARPS": 4, "CHUNKS": 1, "HALVING": 0'
      chunks='"FUSE": 0, "CHUNKS": 4, "FINISH_WARPS": 1'
      OUT="$OUT" "$PY" lab/scripts/tune_topk_fused.py --vocabs "${DENSE_VOCABS:-32000,49152,98304,128256,151936,248320,262144}" \
        --queued-ms "${QUEUED_MS:-0}" --repeats "${REPEATS:-15}" \
        --families "${TUNE_FAMILIES:-iid,clustered,lm_like,smollm2,gemma3}" --bank tests/fixtures/logit_bank \
        --variant default='{}' --variant fused="{$fused, \"REPLACE\": 0, \"SUPER\": 0}" \
        --variant fused_rs="{$fused, \"REPLACE\": 1, \"SUPER\": 8}" \
        --variant all="{$chunks, \"HALVING\": 0, \"REPLACE\": 1, \"SUPER\": 8}" \
        --variant all_h="{$chunks, \"HALVING\": 1, \"REPLACE\": 1, \"SUPER\": 8}" || failed+=(tune_dense)
      ;;
    step_tune)  # the large vocabularies with the sliced variants, the small ones with the one-kernel variants
      OUT="$OUT" LOG=tune_sparse_step_large.log "$PY" lab/scripts/tune_sparse_step.py \
        "${STEP_LARGE_VOCABS:-248320,262144,151936,128256,98304}" "${TUNE_FAMILIES:-iid,clustered,lm_like,smollm2,gemma3}" \
        default,default_sync,old_sync,all,all_v,all_h,all_h_v,c3_h_v,c5_h_v,fused_rs_v || failed+=(step_tune)
      OUT="$OUT" LOG=tune_sparse_step_small.log "$PY" lab/scripts/tune_sparse_step.py \
        "${STEP_SMALL_VOCABS:-49152,32000}" "${TUNE_FAMILIES:-iid,clustered,lm_like,smollm2,gemma3}" \
        default,default_sync,old_sync,old,super8,super8_v,fused_v,fused_rs_v,all_h_v || failed+=(step_tune)
      ;;
    step_profile)
      OUT="$OUT" "$PY" lab/scripts/profile_sparse_step.py "${PROFILE_VOCABS:-32000,49152,248320}" iid,smollm2 \
        "${PROFILE_VARIANTS:-old_sync,default_sync,default}" || failed+=(step_profile)
      ;;
    fixed)
      OUT="$OUT" QUEUED_MS=0 "$PY" lab/scripts/fixed_cost.py "${FIXED_VOCABS:-$SIX}" || failed+=(fixed)
      ;;
    fixed_queued)
      OUT="$OUT" QUEUED_MS="${QUEUED_MS:-1}" "$PY" lab/scripts/fixed_cost.py "${FIXED_VOCABS:-$SIX}" \
        || failed+=(fixed_queued)
      ;;
    dense_profile)
      OUT="$OUT" "$PY" lab/scripts/profile_topk_fused.py "${DENSE_PROFILE_VOCABS:-32000,49152}" || failed+=(dense_profile)
      ;;
    tune)
      OUT="$OUT" LOG="${TUNE_LOG:-tune_sparse_pass.log}" "$PY" lab/scripts/tune_sparse_pass.py "$VOCABS" \
        "${TUNE_FAMILIES:-iid,clustered,lm_like,smollm2,gemma3}" \
        "${TUNE_CONFIGS:-c2,c4,c8,replace,replace_c4,super8,replace_super8,all}" || failed+=(tune)
      ;;
    ab)
      "$PY" -m harness.bench experiment=embedded_verify_sparse server.model_path=embedded:large results_dir=/tmp/ab \
        report=false 'server.args=[--speculative-algorithm,DFLASH,--speculative-num-draft-tokens,"8",--draft-mode,sampled,--speculative-use-block-verification,--max-running-requests,"16",--enable-deterministic-inference,--device,cuda]' \
        2>&1 | tee "$OUT/ab-console.log" || failed+=(ab)
      tar czf "$OUT/ab.tgz" -C /tmp/ab . || failed+=(ab)  # a failed campaign's runs too
      ;;
    *) echo "unknown step $step (tests, micro, queued, odd, builders, profile, probe, tune, tune_dense, step_tune," \
         "step_profile, dense_profile, fixed, fixed_queued, ab or publish)" >&2; exit 2 ;;
  esac
done
echo "results under $OUT"
echo "ended $(date -u +%FT%TZ); failed: ${failed[*]:-none}" >> "$OUT/manifest.txt"
if [ ${#failed[@]} -gt 0 ]; then echo "FAILED: ${failed[*]}" >&2; exit 1; fi
