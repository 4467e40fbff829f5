# One command per chore. `make test` works on a fresh machine: it creates .venv and installs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV := $(BIN)/uv
LOCKS := requirements/cpu.lock requirements/nodeps.lock
LATEST := .venv-latest
NAME ?= env_pool
ARGS ?=

.PHONY: install demo test test-slow test-gpu test-browser test-interop test-latest lock lint bench clean

# The locked set (requirements/*.lock, written by `make lock` with uv, hashes included),
# installed exactly by uv; the project itself editable, without deps. A lock that no longer
# matches pyproject.toml or requirements/*.in is refused before anything is installed.
$(STAMP): pyproject.toml $(LOCKS) requirements/cpu.in requirements/nodeps.in requirements/lock.py
	$(PY) requirements/lock.py check
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	test -x $(UV) || $(BIN)/python -m pip install -q --require-hashes --no-deps -r requirements/bootstrap.txt
	$(BIN)/python requirements/lock.py install --uv $(UV) --python $(BIN)/python
	touch $(STAMP)

$(UV):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes --no-deps -r requirements/bootstrap.txt

# Re-resolve the locks after a dependency change (pins kept where the inputs allow them);
# `make lock UPGRADE=1` moves every pin to the newest release the ranges allow.
lock: $(UV)
	$(BIN)/python requirements/lock.py compile --uv $(UV) $(if $(UPGRADE),--upgrade)

# The newest releases the ranges allow, in a separate environment, through the default
# suite: what an upgrade would break, before `make lock UPGRADE=1` makes it the tested set.
test-latest:
	rm -rf $(LATEST) && $(PY) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q torch==2.13.0
	$(LATEST)/bin/python -m pip install -q -e '.[dev]' matplotlib
	$(LATEST)/bin/python -m pip install -q --no-deps -r requirements/nodeps.in
	$(LATEST)/bin/python -m pip list --format=freeze > $(LATEST)/versions.txt
	$(LATEST)/bin/python -m pytest -q -p no:cacheprovider

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
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -q -p no:cacheprovider $(NUMERICS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m slow

# the first hour on a real node (tests/gpu/test_first_hour.py, one line per check; skips
# cleanly without CUDA or SGLang): run it after `pip install -e '.[gpu]'`, before training
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -v -rs -p no:cacheprovider -m gpu tests/gpu tests/unit/test_generation_sglang.py tests/kernels

# spade report's page in headless Chromium: Debian's chromium-headless-shell (apt-get, as
# root) driven by Playwright's Python package, which downloads no browser build of its own.
# The real libraries that environment sources and exports meet (docs/interop.md): verifiers,
# openenv-core, gem-llm, in an environment of their own from requirements/interop.lock (gem-llm
# pins another reasoning-gym than the main lock). The project and its locked dependencies come
# from .venv through a .pth (site.addsitedir: its editable install included), after the
# interop site-packages, so the interop pins win.
INTEROP := .venv-interop
test-interop: $(STAMP)
	test -x $(INTEROP)/bin/python || $(UV) venv -q --python $(BIN)/python $(INTEROP)
	VIRTUAL_ENV=$(INTEROP) $(UV) pip sync -q --compile-bytecode --require-hashes requirements/interop.lock
	VIRTUAL_ENV=$(INTEROP) $(UV) pip install -q --no-deps --compile-bytecode tests/fixtures/textgym_pkg tests/fixtures/vfgames_pkg
	printf "import site; site.addsitedir('%s')\n" "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
		> "$$($(INTEROP)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zz_spade_main.pth"
	$(INTEROP)/bin/python -m pytest -q -p no:cacheprovider -m interop tests/interop

test-browser: $(STAMP)
	command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell; }
	$(BIN)/python -c "import playwright" 2>/dev/null || $(BIN)/python -m pip install -q playwright
	$(BIN)/python -m pytest -q -p no:cacheprovider -m browser tests/browser

lint: $(STAMP)
	$(BIN)/ruff check spade_async kernels bench tests requirements
	$(BIN)/ruff format --check spade_async kernels bench requirements
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/$(NAME).py $(ARGS)

clean:
	rm -rf $(VENV) $(LATEST) build *.egg-info

# GPU machine (its own python3 image; wheels from `make gpu-wheels` travel in .whl/):
.PHONY: gpu-check gpu-wheels
gpu-check:
	bash bench/gpu_wheels.sh --install /tmp/site
	PYTHONPATH=/tmp/site:$(CURDIR):$(CURDIR)/kernels python3 bench/gpu_check.py --out $${OUT:-runs/gpu_check} $(ARGS)

gpu-wheels:
	bash bench/gpu_wheels.sh
