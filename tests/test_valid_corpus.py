"""The valid corpus (tests/valid/*.py): files at the contract's edges that must be accepted,
read the way ``spade env check`` reads a file (``read_source``) and checked by the real
gates in one sandboxed pool, each several times (the garbage is drawn afresh per check).

- generic_base.py: an abstract ``Generic`` base named ...Env, the concrete env subclassing
  it through a subscripted base (``_CounterEnv[int]``);
- bom_source.py: a UTF-8 byte-order mark before the first line;
- coding_cookie.py: Latin-1 bytes under a PEP 263 coding declaration.
"""

from __future__ import annotations

import ast
from pathlib import Path

import anyio
import pytest

from spade_async.envs.pool import EnvPool, PoolConfig
from spade_async.envs.static import find_env_class
from spade_async.envs.validate import read_source, validate_source

CORPUS = Path(__file__).resolve().parent / "valid"
EXPECTED = {  # file -> the class the static stage must find
    "generic_base.py": "SumToTargetEnv",
    "bom_source.py": "BomGuessEnv",
    "coding_cookie.py": "LatinGuessEnv",
}
CHECKS = 3  # per file: each check draws other garbage


def test_corpus_is_complete():
    assert {p.name for p in CORPUS.glob("*.py")} == set(EXPECTED)
    assert (CORPUS / "bom_source.py").read_bytes().startswith(b"\xef\xbb\xbf")
    raw = (CORPUS / "coding_cookie.py").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_read_as_python_reads_it(name):
    source = read_source(CORPUS / name)
    assert isinstance(source, str), source
    compile((CORPUS / name).read_bytes(), name, "exec")  # Python's own reader accepts it
    assert find_env_class(ast.parse(source)) == EXPECTED[name]


def test_every_valid_file_is_accepted():
    async def go() -> dict:
        out: dict[str, list] = {}
        async with EnvPool(PoolConfig(max_workers=4, prewarm=2)) as pool:
            for name in sorted(EXPECTED):
                source = read_source(CORPUS / name)
                out[name] = [await validate_source(source, pool=pool) for _ in range(CHECKS)]
        return out

    verdicts = anyio.run(go)
    for name, vs in verdicts.items():
        for v in vs:
            assert v.valid and v.stage == "ok", f"{name}: {v.stage} ({v.reason})"
            assert v.env_class == EXPECTED[name] and v.feasibility == "proven"
