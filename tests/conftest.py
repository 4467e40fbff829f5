"""Shared fixtures. Tests run on CPU with tiny random-initialised models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Never reach for a model hub from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tokenizer_path() -> Path:
    """The SmolLM2 tokenizer, converted once from the embedded GGUF into the cache."""
    from spade_async.models import tokenizer_dir

    return tokenizer_dir("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, tokenizer_path) -> Path:
    """A 2-layer, 64-wide random Llama with SmolLM2's tokenizer (vocab 49,152)."""
    from spade_async.models import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")
