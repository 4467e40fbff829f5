"""The pinned SGLang release's source, once per session (downloaded into the cache when
absent; a failed download fails these tests, it never skips them)."""

from __future__ import annotations

import pytest

from spade_async.errors import SpadeError
from spade_async.generation.sglang_source import SGLangSource, wheel_path


@pytest.fixture(scope="session")
def sglang_src() -> SGLangSource:
    try:
        return SGLangSource.from_wheel(wheel_path())
    except SpadeError as exc:
        pytest.fail(str(exc), pytrace=False)
