"""Environment sources by scheme (spade_async.envs.sources): rg:, gym:, gem:, verifiers:.

Without the interop packages (tests/interop/ drives those): reasoning-gym and gymnasium are in
the main environment, so the rg: source is checked end to end (made, gated in the sandbox,
stored with its origin), the gym: wrapper is run in-process on a text environment, and every
bad value is one line, exit 2, memory untouched."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import anyio
import pytest

from spade_async.envs import sources
from spade_async.envs.sources import SourceError, answers, hub, literal
from spade_async.envs.sources import gym as gym_source
from spade_async.memory.cli import main as memory_main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _module(code: str, name: str) -> types.ModuleType:
    """Our own generated source, executed in this process (trusted: the importer wrote it)."""
    mod = types.ModuleType(name)
    exec(compile(code, name, "exec"), mod.__dict__)
    return mod


def _env_class(mod: types.ModuleType):
    (cls,) = [v for k, v in vars(mod).items() if isinstance(v, type) and k.endswith("Env")
              and v.__module__ == mod.__name__]  # fmt: skip
    return cls


def test_scheme_parsing_and_bad_values():
    assert sources.is_scheme("rg:leg_counting") and not sources.is_scheme("/data/pool")
    assert not sources.is_scheme("C:\\pool") and not sources.is_scheme("http://x")
    src = sources.parse("rg:a,b?size=5&seed=3")
    assert (src.scheme, src.target, src.options) == ("rg", "a,b", {"size": "5", "seed": "3"})
    assert src.packages == ("reasoning-gym",)
    with pytest.raises(SourceError, match="unknown environment source scheme 'foo'.*'rg:'"):
        sources.parse("foo:bar")
    with pytest.raises(SourceError, match="names nothing after 'gym:'"):
        sources.parse("gym:")
    with pytest.raises(SourceError, match="unknown option 'sise'"):
        sources.load("rg:leg_counting?sise=4")
    with pytest.raises(SourceError, match=r"size='0' must be an integer in \[1, 100000\]"):
        sources.load("rg:leg_counting?size=0")


def test_literal_admits_plain_data_only():
    assert eval(literal({"a": (1, 2.5, None), "b": ["x", {3}]})) == {
        "a": (1, 2.5, None),
        "b": ["x", {3}],
    }
    with pytest.raises(ValueError, match="not plain data"):
        literal(object())
    with pytest.raises(ValueError, match="not plain data"):
        literal([Path("/x")])
    assert sources.class_name("basic_arithmetic") == "BasicArithmeticEnv"
    assert sources.class_name("2048") == "E2048Env"


def test_boxed_reads_the_last_balanced_box():
    assert answers.boxed("so \\boxed{1} no, \\boxed{ {a}{b} }") == "{a}{b}"
    assert answers.boxed("\\boxed{unclosed") is None and answers.boxed("none") is None
    assert answers.balanced("{x}") and not answers.balanced("}{")


def test_rg_source_scores_with_reasoning_gym():
    src, items, notes = sources.load("rg:leg_counting,basic_arithmetic?size=6&attempts=2")
    assert [i.skill for i in items] == ["rg-leg_counting", "rg-basic_arithmetic"]
    assert items[0].origin == "rg:leg_counting?seed=42&size=6&attempts=2#0:6"
    assert src.packages == ("reasoning-gym",)
    mod = _module(items[0].code, "rg_env_test")
    assert len(mod.ENTRIES) + sum(n.startswith("leg_counting[") for n in notes) == 6
    env = _env_class(mod)()
    for seed in range(len(mod.ENTRIES)):
        obs, info = env.reset(seed)
        assert mod.ENTRIES[seed]["question"] in obs and info["index"] == seed
        (action,) = env.solution()
        assert env.step(action)[1:3] == (1.0, True)
    obs, _ = env.reset(7)  # one task per seed: 7 % n
    assert env.step("\\boxed{-1}")[1:3] == (0.0, False)  # a second attempt remains
    obs, reward, term, _, _ = env.step("no box at all")
    assert (reward, term) == (0.0, True) and "No \\boxed" in obs
    # the same value makes the same source, byte for byte (fixed hash seed in the child)
    assert sources.load("rg:leg_counting?size=6&attempts=2")[1][0].code == items[0].code


def test_rg_unknown_dataset_names_the_near_ones():
    with pytest.raises(SourceError, match="no dataset 'leg_countin'.*did you mean leg_counting"):
        sources.load("rg:leg_countin")


def test_gym_wrapper_runs_a_text_env(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES / "textgym_pkg"))
    code = hub.wrapper(
        what="Gymnasium", imports="import gymnasium", make=gym_source._MAKE,
        env_id="spade_textgym:spade/GuessNumber-v0", origin="gym:x", skill="gym-x", max_turns=4,
    )  # fmt: skip
    env = _env_class(_module(code, "gym_env_test"))()
    obs, info = env.reset(seed=5)
    assert "Guess the number" in obs and info == {}
    wrong = "\\boxed{0}"
    assert [env.step(wrong)[3] for _ in range(4)] == [False, False, False, True]  # turn cap
    env.reset(seed=5)
    assert env.step(env.solution()[0])[1:3] == (1.0, True)
    first = env.reset(seed=5)[0], env.solution()
    assert (env.reset(seed=5)[0], env.solution()) == first


def test_gym_refuses_non_text_spaces():
    with pytest.raises(SourceError, match="'FrozenLake-v1' is not a text environment.*Discrete"):
        sources.load("gym:FrozenLake-v1")


@pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is not None, reason="verifiers is installed"
)
def test_verifiers_without_the_library_is_one_line():
    with pytest.raises(
        SourceError, match="needs the Python package 'verifiers'.*pip install verifiers"
    ):
        sources.load("verifiers:vf_reverse_text")
    with pytest.raises(SourceError, match="unknown option 'attempts' for 'verifiers:'"):
        sources.load("verifiers:vf_reverse_text?attempts=2")


def test_verifiers_rows_kept_by_their_own_answers():
    """Checked rows only when any own answer scores 1.0; else every row, unverified."""
    from spade_async.envs.sources.verifiers import keep

    rows = [{"answer": "1"}, {"answer": "2"}, {"answer": ""}, {"answer": "4"}]
    checks = [
        {"i": 0, "solution": "<a>1</a>", "turns": 1, "score": 1.0, "why": None},
        {"i": 1, "solution": None, "turns": 0, "score": 0.5, "why": None},
        {"i": 3, "solution": "4", "turns": 2, "score": 1.0, "why": None},
    ]
    notes: list[str] = []
    kept = keep(rows, checks, notes)
    assert kept == [rows[0] | {"solution": "<a>1</a>", "turns": 1},
                    rows[3] | {"solution": "4", "turns": 2}]  # fmt: skip
    assert notes == [
        "row 1 left out: its own answer scores 0.5",
        "row 2 left out: no answer to check",
    ]
    crashed = [{"i": 0, "solution": None, "turns": 0, "score": None, "why": "RuntimeError: x"}]
    notes = []
    assert keep(rows, crashed, notes) == [r | {"solution": None, "turns": 0} for r in rows]
    assert notes[0] == "row 0: checking its own answer failed (RuntimeError: x)"
    assert "row 1: its own answer not checked" in notes[1] and "unverified" in notes[-1]
    wrong = [{"i": i, "solution": None, "turns": 0, "score": 0.0, "why": None} for i in (0, 1, 3)]
    assert keep(rows, wrong, []) == []  # every own answer checked, none right: nothing to write
    assert keep([{"q": 1}], [], []) == [{"q": 1, "solution": None, "turns": 0}]


def test_verifiers_source_writes_rows_as_literals():
    import ast

    from spade_async.envs.sources.vf_source import source
    from spade_async.envs.static import find_env_class

    rows = [{"prompt": [{"role": "user", "content": '"""\nimport os; os._exit(1)  # {x}'}],
             "answer": "1", "example_id": 0, "solution": "1", "turns": 1}]  # fmt: skip
    code = source("vf_demo", rows, origin="verifiers:vf_demo?size=1#0:1", max_turns=7)
    tree = ast.parse(code)
    assert find_env_class(tree) == "VfDemoEnv"
    values = {n.targets[0].id: n.value for n in tree.body
              if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}  # fmt: skip
    assert ast.literal_eval(values["ROWS"]) == rows
    assert ast.literal_eval(values["MAX_TURNS"]) == 7
    assert ast.literal_eval(values["MODULE"]) == "vf_demo"


@pytest.mark.skipif(importlib.util.find_spec("gem") is not None, reason="gem-llm is installed")
def test_missing_library_names_what_to_install():
    with pytest.raises(SourceError, match="needs the Python package 'gem'.*pip install gem-llm"):
        sources.load("gem:game:GuessTheNumber-v0-easy")


@pytest.mark.parametrize(
    "value, message",
    [
        ("zz:top", "unknown environment source scheme 'zz'"),
        ("rg:no_such_dataset", "reasoning-gym has no dataset 'no_such_dataset'"),
        ("gym:Taxi-v4", "'Taxi-v4' is not a text environment"),
    ],
)
def test_cli_bad_source_is_one_line_and_memory_unchanged(tmp_path, capsys, value, message):
    run = tmp_path / "run"
    from spade_async.cli.dispatch import main

    assert main(["memory", "import", value, "--run", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not run.exists()


def test_import_rg_through_the_gates(tmp_path, capsys):
    run = tmp_path / "run"
    assert memory_main(["import", "rg:leg_counting?size=4", "--run", str(run)]) == 0
    assert "accepted 1, rejected 0" in capsys.readouterr().out
    from spade_async.memory.store import MemoryStore

    with MemoryStore(run / "memory.lmdb", readonly=True) as store:
        (rec,) = list(store.records())
    assert rec.valid and rec.feasibility == "proven" and rec.skill == "rg-leg_counting"
    assert (rec.origin.kind, rec.origin.source) == ("import", "rg:leg_counting?seed=42&size=4#0:4")


@pytest.mark.parametrize(
    "make, stages",
    [
        ("def _make():\n    import os\n    os._exit(3)\n", ("crash", "load")),
        ("def _make():\n    while True:\n        pass\n", ("timeout",)),
    ],
    ids=["crashes", "hangs"],
)
def test_a_misbehaving_hub_env_is_rejected_not_raised(tmp_path, make, stages):
    """A source whose code crashes or hangs inside the sandbox is a rejected record, never an
    error: the gates judge it as they judge a generated environment."""
    from spade_async.envs.pool import EnvPool, PoolConfig
    from spade_async.envs.sources import Item
    from spade_async.memory.importer import Loaded, import_files
    from spade_async.memory.store import MemoryStore

    code = hub.wrapper(
        what="Gymnasium", imports="import gymnasium", make=make, env_id="Bad-v0",
        origin="gym:Bad-v0", skill="gym-bad", max_turns=3,
    )  # fmt: skip
    loaded = Loaded(
        value="gym:Bad-v0", items=[Item(code=code, origin="gym:Bad-v0", skill="gym-bad")],
        notes=[], packages=("gymnasium",),
    )  # fmt: skip

    async def run(store):
        config = PoolConfig(packages=("gymnasium",), open_timeout_s=3.0, max_workers=2)
        async with EnvPool(config) as pool:
            return await import_files(store, loaded, pool=pool)

    with MemoryStore(tmp_path / "memory.lmdb") as store:
        (out,) = anyio.run(run, store)
        assert out.outcome == "rejected" and out.stage in stages, (out.stage, out.reason)
        (rec,) = list(store.records())
        assert not rec.valid and rec.origin.source == "gym:Bad-v0"


def test_recipe_checks_the_pool_binds_the_source(tmp_path):
    from spade_async import recipe
    from spade_async.errors import ConfigError

    root = Path(__file__).resolve().parents[2] / "configs" / "qwen3-8b-rg-fixed-pool.toml"
    cfg = recipe.load(root)
    assert cfg.fixed_pool.startswith("rg:") and cfg.envs.packages == ("reasoning-gym",)
    assert len(sources.parse(cfg.fixed_pool).target.split(",")) == 24
    with pytest.raises(ConfigError, match="imports 'reasoning-gym' in the sandbox"):
        recipe.load(root, ["envs.packages=[]"])
    with pytest.raises(SourceError, match="unknown environment source scheme 'zz'"):
        recipe.load(root, ["fixed_pool='zz:q'"])
