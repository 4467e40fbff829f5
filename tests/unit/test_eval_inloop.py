"""In-loop evaluation: when it fires, what it logs, and recipe checks."""

import json
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from spade_async import recipe
from spade_async.errors import ConfigError
from spade_async.eval import inloop
from spade_async.eval.types import EvalConfig


def test_due():
    cfg = EvalConfig(interval=3, before_train=True)
    assert [v for v in range(10) if inloop.due(cfg, v, None)] == [0, 3, 6, 9]
    assert not inloop.due(cfg, 3, 3)
    assert [v for v in range(5) if inloop.due(EvalConfig(interval=2), v, None)] == [2, 4]
    assert not any(inloop.due(EvalConfig(), v, None) for v in range(5))


def test_per_suite_overrides_win():
    from spade_async.eval.runner import settings_for
    from spade_async.eval.suites import make_suite

    aime = make_suite("aime25")
    s = settings_for(aime, n=1, max_tokens=64, extra={"n": 32.0, "temperature": 0.7})
    assert (s.n, s.temperature, s.max_tokens, s.top_k) == (32, 0.7, 64, 20)
    assert settings_for(aime).n == 64  # the reference's offline default


def test_recipe_eval_section():
    cfg = recipe.load(None, ["eval.interval=4", 'eval.suites=["rg_logic"]'])
    assert cfg.eval.interval == 4 and cfg.eval.suites == ["rg_logic"]
    with pytest.raises(ConfigError, match="did you mean 'rg_logic'"):
        recipe.load(None, ['eval.suites=["rg_logik"]'])


class _Sink:
    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)


class _Tel:
    def __init__(self):
        self.records = []
        self.sinks = [_Sink()]

    def log(self, step, values, *, kind="step"):
        self.records.append((step, kind, values))
        return {"step": step, "kind": kind, **values}


def test_evaluator_runs_while_versions_advance(tmp_path, monkeypatch):
    rows = [{"Question": f"Q{i}?", "Correct Answer": "yes", "Incorrect Answer 1": "a",
             "Incorrect Answer 2": "b", "Incorrect Answer 3": "c"} for i in range(4)]  # fmt: skip
    data = tmp_path / "gpqa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = EvalConfig(interval=2, before_train=True, suites=["gpqa_diamond"], n=2,
                     data={"gpqa_diamond": str(data)})  # fmt: skip

    class Gold:
        def __init__(self, client, tokenizer):
            pass

        async def __call__(self, messages, sampling, *, item=None):
            return f"\\boxed{{{item.answer}}}"

    monkeypatch.setattr(inloop, "ClientGenerator", Gold)
    monkeypatch.setattr(inloop, "POLL_S", 0.01)
    rt = SimpleNamespace(
        cfg=SimpleNamespace(eval=cfg, model="m"), client=None, tokenizer=None, pool=None,
        tel=_Tel(), state=SimpleNamespace(version=0, step=0), run_dir=SimpleNamespace(root=tmp_path),
    )  # fmt: skip

    async def main():
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(inloop.evaluator, rt, stop)
            for v in range(1, 5):  # training advances the policy meanwhile
                await anyio.sleep(0.2)
                rt.state.version = rt.state.step = v
            await anyio.sleep(0.3)
            stop.set()

    anyio.run(main)
    versions = [vals["eval/policy_version"] for _, kind, vals in rt.tel.records]
    assert versions == [0, 2, 4]
    assert [r["eval/policy_version"] for r in rt.tel.sinks[0].records] == versions
    assert all(kind == "eval" and vals["eval/gpqa_diamond/avg@2"] == 1.0 for _, kind, vals in rt.tel.records)
    for v in versions:
        res = json.loads((Path(tmp_path) / "eval" / f"v{v}" / "results.json").read_text())
        assert res["policy_version"] == v and res["suites"]["gpqa_diamond"]["samples"] == 8


def test_evaluation_does_not_wait_behind_a_full_training_pool(tmp_path, monkeypatch):
    """Training episodes may hold every worker of the run's pool; evaluation's code checks
    run in a pool of their own, so a gold HumanEval still scores 1.0 (in training's pool it
    would wait past the capacity wait, fail as 'busy' and score 0)."""
    import sys

    from spade_async.envs.pool import EnvPool, PoolConfig

    sys.path.insert(0, str(Path(__file__).parent))
    from eval_scripted import Scripted, gold_reply

    monkeypatch.setattr(inloop, "ClientGenerator", lambda client, tokenizer: Scripted(gold_reply))
    monkeypatch.setattr(inloop, "POLL_S", 0.01)
    cfg = EvalConfig(interval=0, before_train=True, suites=["humaneval"], n=1, limit=2)
    busy = """
class BusyEnv:
    def reset(self, seed=None):
        return "", {}
    def step(self, action):
        return "", 0.0, True, False, {}
"""

    async def main():
        training = PoolConfig(max_workers=1, prewarm=0, capacity_wait_s=0.5)
        async with EnvPool(training) as pool:
            await pool.open(busy)  # training's episode holds its only worker
            rt = SimpleNamespace(
                cfg=SimpleNamespace(eval=cfg, model="m"), client=None, tokenizer=None,
                pool=pool, tel=_Tel(), state=SimpleNamespace(version=0, step=0),
                run_dir=SimpleNamespace(root=tmp_path),
            )  # fmt: skip
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(inloop.evaluator, rt, stop)
                with anyio.fail_after(120):
                    while not rt.tel.records:
                        await anyio.sleep(0.05)
                stop.set()
            return rt.tel.records

    records = anyio.run(main)
    assert [vals["eval/humaneval/avg@1"] for _, _, vals in records] == [1.0]


def test_dashboard_panel_shows_eval_curves():
    from rich.console import Console

    from spade_async.telemetry.dashboard import _State
    from spade_async.telemetry.panels import evaluation, render

    st = _State()
    assert evaluation(st) is None
    st.update({"step": 1, "kind": "step", "loss": 0.5})
    for v, x in ((0, 0.1), (2, 0.3), (4, 0.45)):
        st.update({"step": v, "kind": "eval", "eval/policy_version": v, "eval/aime25/avg@1": x})
    assert [p for p in st.evals["eval/aime25/avg@1"]] == [(0, 0.1), (2, 0.3), (4, 0.45)]
    con = Console(width=140, record=True)
    con.print(render(st, "run"))
    text = con.export_text()
    assert "held-out evaluation" in text and "aime25/avg@1 v4" in text
