#!/usr/bin/env bash
# Fill .whl/ with the cp312 manylinux wheels bench/gpu_check.py needs on the GPU image
# (Python 3.12, torch/triton/transformers already there; msgspec and liger-kernel are not).
# Usage: bash bench/gpu_wheels.sh   (from the repository root; needs PyPI, not the GPU)
# On the device:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WHEELS=(
  "msgspec==0.23.0"      # trainer batch/config structs (C extension, cp312 wheel)
  "liger-kernel==0.8.5"  # fused linear cross-entropy, the comparison in the kernels part
)
rm -rf .whl && mkdir -p .whl
for w in "${WHEELS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$w"
done
ls -l .whl
total=$(du -cb .whl/*.whl | tail -1 | cut -f1)
echo "total ${total} bytes"
if (( total > 60 * 1024 * 1024 )); then
  echo "error: .whl/ holds ${total} bytes; the device carries 64 MiB in all" >&2
  exit 2
fi
