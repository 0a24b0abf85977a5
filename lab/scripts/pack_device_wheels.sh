#!/usr/bin/env bash
# What a lent H200 host (Python 3.12, torch, Triton, no network) needs beyond its image, packed here, small enough to
# travel with the tree in one call (the device carries 64 MiB in all; the tree is ~13 MB):
#   .whl/   hydra-core, omegaconf, antlr4 4.9.3 (built from its sdist: PyPI has no wheel), dill, math-verify,
#           latex2sympy2-extended, orjson (~0.9 MB)
#   .gpuk/  FlashInfer 0.7.0 from ../shared/gpu with its top-k module compiled ahead of time for sm_90a, the wheel
#           repacked without flashinfer/data/{csrc,cutlass,cccl,spdlog} (sources for its JIT, which the host
#           cannot run anyway: FLASHINFER_DISABLE_JIT=1), and tvm-ffi (~28 MB instead of 51)
# lab/scripts/h200_sparse.sh installs both (WHEELS, FLASHINFER). Both folders are ignored by git; name them in the
# device call's carry. Usage, from the repository root: lab/scripts/pack_device_wheels.sh [SHARED_GPU_DIR]
set -euo pipefail
GPU=$(cd "${1:-../shared/gpu}" && pwd)
ROOT=$(pwd)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform any)
rm -rf .whl .gpuk
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .whl hydra-core==1.3.2 omegaconf==2.3.0 dill math-verify latex2sympy2_extended orjson
work=$(mktemp -d)
python3 -m pip download -q --no-deps --no-binary=:all: -d "$work" antlr4-python3-runtime==4.9.3
python3 -m pip wheel -q --no-deps -w .whl "$work"/antlr4-python3-runtime-4.9.3.tar.gz
mkdir -p .gpuk/flashinfer-aot-sm90a/topk "$work/fi"
cp "$GPU"/apache_tvm_ffi-*.whl .gpuk/
cp "$GPU"/flashinfer-aot-sm90a/topk/topk.so .gpuk/flashinfer-aot-sm90a/topk/
(cd "$work/fi" && python3 -m zipfile -e "$GPU"/flashinfer_python-*.whl . \
  && rm -rf flashinfer/data/csrc flashinfer/data/cutlass flashinfer/data/cccl flashinfer/data/spdlog)
fi_wheel=$(basename "$GPU"/flashinfer_python-*.whl)
(cd "$work/fi" && python3 -m zipfile -c "$ROOT/.gpuk/$fi_wheel" flashinfer flashinfer_python-*.dist-info)
rm -rf "$work"
du -sh .whl .gpuk
