"""Range checks at load (issue 45): every numeric config value has a bound in one table
(``config_bounds.BOUNDS``); a value just outside it, NaN or infinity is refused in one line
naming the key, the value and the range, from every command that reads a config."""

from __future__ import annotations

import math
import re

import pytest

from spade_async import config_bounds as cb
from spade_async import recipe
from spade_async.config import convert, field_docs
from spade_async.errors import ConfigError
from spade_async.recipe import Config
from spade_async.trainer.config import LoraConfig

NUMERIC = re.compile(r"\b(int|float)\b")


def _numeric_fields() -> dict[str, str]:
    """Every leaf of Config whose type holds a number (containers included): path -> type."""
    rows = field_docs(Config) + field_docs(LoraConfig, "trainer.lora.")
    return {path: tp for path, tp, _, _ in rows if NUMERIC.search(tp)}


FIELDS = _numeric_fields()
EVAL_KEYS = ("n", "temperature", "top_p", "top_k", "max_tokens")  # eval.overrides.SUITE.KEY


def test_every_numeric_field_has_a_bound():
    missing = [p for p in FIELDS if p not in cb.BOUNDS and p != "eval.overrides"]
    assert not missing, f"numeric config fields without a range in config_bounds.BOUNDS: {missing}"
    assert all(f"eval.overrides.*.{k}" in cb.BOUNDS for k in EVAL_KEYS)
    stale = [k for k in cb.BOUNDS if "*" not in k and k not in FIELDS]
    assert not stale, f"BOUNDS entries that name no numeric field: {stale}"
    assert len(FIELDS) > 140  # the walk found the whole schema


def _cases():
    """(key, an override path, a value just outside, the struct's value) per bound side."""
    for key, bound in cb.BOUNDS.items():
        is_int = "float" not in FIELDS.get(key, "float") and "*" not in key
        for side in ("lo", "hi"):
            edge = getattr(bound, side)
            if getattr(bound, f"{side}_open"):
                out = edge
            elif is_int:
                out = int(edge) + (1 if side == "hi" else -1)
            else:
                out = math.nextafter(float(edge), math.inf if side == "hi" else -math.inf)
            if out in bound.also:
                out = out - 1 if side == "lo" else out + 1
            yield pytest.param(key, side, out, id=f"{key}-{side}")


def _override(key: str, value) -> tuple[str, str]:
    """The ``--set`` override for ``key`` = ``value`` and the path the error names."""
    tp = FIELDS.get(key, "")
    text = repr(value)
    if key.startswith("eval.overrides.*."):
        path = key.replace("*", "aime25")
        return f"{path}={text}", path
    if tp.startswith("list[list["):
        return f"{key}=[[{text}]]", f"{key}[0][0]"
    if tp.startswith(("list[", "tuple[")):
        return f"{key}=[{text}, {text}]", f"{key}[0]"
    return f"{key}={text}", key


@pytest.mark.parametrize(("key", "side", "value"), list(_cases()))
def test_a_value_just_outside_its_range_is_one_line(key, side, value):
    override, path = _override(key, value)
    with pytest.raises(ConfigError) as err:
        recipe.load(None, [override])
    assert str(err.value) == (
        f"config: {path} = {value!r} is out of range: must be {cb.BOUNDS[key]}"
    )


@pytest.mark.parametrize("key", [k for k in cb.BOUNDS if "*" not in k])
def test_the_edges_themselves_are_in_range(key):
    """Just inside each end passes the range check (the table says what it means)."""
    bound = cb.BOUNDS[key]
    for side in ("lo", "hi"):
        edge = float(getattr(bound, side))
        if getattr(bound, f"{side}_open"):
            edge = math.nextafter(edge, -math.inf if side == "hi" else math.inf)
        value = edge if "float" in FIELDS[key] else int(edge)
        if "float" not in FIELDS[key] and getattr(bound, f"{side}_open"):
            value = int(getattr(bound, side)) + (1 if side == "lo" else -1)
        assert bound.holds(value), (key, value)
        data, node = {}, None
        parts = key.split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        tp = FIELDS[key]
        node[parts[-1]] = (
            [[value]] if tp.startswith("list[list[") else
            [value, value] if tp.startswith(("list[", "tuple[")) else value
        )  # fmt: skip
        convert(Config, data)  # raises ConfigError if the edge were refused


FLOATS = [k for k, tp in FIELDS.items() if "float" in tp and k != "eval.overrides"]


@pytest.mark.parametrize("key", FLOATS)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_nan_and_infinity_are_refused_for_every_float(key, bad):
    override, path = _override(key, float(bad))
    override = override.replace(repr(float(bad)), bad)
    with pytest.raises(ConfigError, match=re.escape(f"config: {path} = {float(bad)!r} is out")):
        recipe.load(None, [override])


def test_the_issues_examples():
    cases = {
        "memory.queue_size=-1": "config: memory.queue_size = -1 is out of range: must be in [1, ",
        "client.max_concurrency=0": "config: client.max_concurrency = 0 is out of range",
        "memory.initial_map_mib=0": "config: memory.initial_map_mib = 0 is out of range",
        "agent.max_turns=-2": "config: agent.max_turns = -2 is out of range",
        "agent.max_turn_tokens=-1": "config: agent.max_turn_tokens = -1 is out of range",
        "envs.memory_mb=-1": "config: envs.memory_mb = -1 is out of range",
        "agent.temperature=nan": "config: agent.temperature = nan is out of range",
        "eval.overrides.aime25.temperature=nan": "config: eval.overrides.aime25.temperature = nan",
        "trainer.lora.rank=0": "config: trainer.lora.rank = 0 is out of range",
    }
    for override, line in cases.items():
        with pytest.raises(ConfigError) as err:
            recipe.load(None, [override])
        assert str(err.value).startswith(line) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "url",
    ["localhost:30000", "htp://h:1", "http://:1", "http://h", "http://h:0", "http://h:99999",
     "http://h:x", "http://h:1/v1", "http://h:1?a=b", "http://u@h:1", "http://h :1",
     "http://h:1\x1b[2J", "", "file:///etc/passwd"],
)  # fmt: skip
def test_malformed_external_urls_are_refused(url):
    with pytest.raises(ConfigError) as err:
        convert(Config, {"engine": {"external": ["http://ok:1", url]}})
    msg = str(err.value)
    assert msg.startswith(f"config: engine.external[1] = {url!r} is out of range: must be an http")


def test_well_formed_external_urls_pass():
    for url in ("http://127.0.0.1:30000", "https://gpu-node-3:8000/", "http://[::1]:30000"):
        assert cb.url_problem(url) is None, url


def test_every_shipped_recipe_is_in_range():
    from pathlib import Path

    configs = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))
    assert configs
    for path in configs:
        recipe.load(path)  # raises ConfigError naming the value if a recipe were out of range


def test_a_section_read_alone_is_checked_as_in_the_whole_config(tmp_path):
    """``spade memory verify --repair`` reads only the run's [memory]: the same ranges."""
    from spade_async.memory.repair import run_memory_config
    from spade_async.memory.store import MemoryConfig

    with pytest.raises(ConfigError, match=re.escape("config: memory.num_perm = 0 is out of")):
        convert(MemoryConfig, {"num_perm": 0}, at="memory")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[memory]\nqueue_size = -1\n")
    with pytest.raises(ConfigError) as err:
        run_memory_config(run / "memory.lmdb")
    assert "config: memory.queue_size = -1 is out of range: must be in [1, " in str(err.value)
    assert "\n" not in str(err.value)
