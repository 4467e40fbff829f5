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


def _polled(cfg, versions):
    """The versions an evaluator polling ``versions`` evaluates, with the boundaries late."""
    last, out = None, []
    for v in versions:
        if inloop.due(cfg, v, last):
            out.append((v, inloop.late(cfg, v, last)))
            last = v
    return out


def test_due():
    cfg = EvalConfig(interval=3, before_train=True)
    assert _polled(cfg, range(10)) == [(0, []), (3, []), (6, []), (9, [])]
    assert not inloop.due(cfg, 3, 3)
    assert [v for v, _ in _polled(EvalConfig(interval=2), range(5))] == [2, 4]
    assert _polled(EvalConfig(), range(5)) == []
    # a long evaluation at v3: the loop next sees v7, then v8; boundaries 6 passed meanwhile
    assert _polled(cfg, [0, 3, 7, 8, 9, 13]) == [(0, []), (3, []), (7, [6]), (9, []), (13, [12])]
    # an evaluation spanning two boundaries folds both into one (both named)
    assert _polled(EvalConfig(interval=2), [2, 7]) == [(2, []), (7, [4, 6])]


def test_eval_n_default_is_each_suites_default():
    from spade_async.eval.runner import settings_for
    from spade_async.eval.suites import make_suite

    cfg = EvalConfig()
    assert cfg.n == 0  # the doc: "0 = each suite's default"
    assert settings_for(make_suite("aime25"), n=cfg.n).n == 64
    assert settings_for(make_suite("aime25"), n=1).n == 1


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
        def __init__(self, client, tokenizer, **kw):
            pass

        async def __call__(self, messages, sampling, *, item=None):
            return f"\\boxed{{{item.answer}}}"

    monkeypatch.setattr(inloop, "ClientGenerator", Gold)
    monkeypatch.setattr(inloop, "POLL_S", 0.01)
    rt = SimpleNamespace(
        cfg=SimpleNamespace(eval=cfg, model="m", seed=0), client=None, tokenizer=None, pool=None,
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
    assert all(
        kind == "eval" and vals["eval/gpqa_diamond/avg@2"] == 1.0
        for _, kind, vals in rt.tel.records
    )
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

    monkeypatch.setattr(
        inloop, "ClientGenerator", lambda client, tokenizer, **kw: Scripted(gold_reply)
    )
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
                cfg=SimpleNamespace(eval=cfg, model="m", seed=0), client=None, tokenizer=None,
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


def test_a_boundary_passed_during_a_long_evaluation_is_evaluated_late_and_logged(
    tmp_path, monkeypatch
):
    """interval 2; the v2 evaluation lasts while training reaches v5: the v4 boundary is not
    skipped: v5 is evaluated for it, with a warning event and eval/due_version = 4."""
    rows = [{"Question": "Q?", "Correct Answer": "yes", "Incorrect Answer 1": "a",
             "Incorrect Answer 2": "b", "Incorrect Answer 3": "c"}]  # fmt: skip
    data = tmp_path / "gpqa.jsonl"
    data.write_text(json.dumps(rows[0]) + "\n")
    cfg = EvalConfig(interval=2, suites=["gpqa_diamond"], n=1, data={"gpqa_diamond": str(data)})
    rt = SimpleNamespace(
        cfg=SimpleNamespace(eval=cfg, model="m", seed=0), client=None, tokenizer=None, pool=None,
        tel=_Tel(), state=SimpleNamespace(version=0, step=0), run_dir=SimpleNamespace(root=tmp_path),
    )  # fmt: skip

    class Slow:
        def __init__(self, client, tokenizer, **kw):
            pass

        async def __call__(self, messages, sampling, *, item=None, tools=None):
            if rt.state.version == 2:  # the v2 evaluation: training advances meanwhile
                for v in (3, 4, 5):
                    await anyio.sleep(0.05)
                    rt.state.version = rt.state.step = v
            return f"\\boxed{{{item.answer}}}"

    monkeypatch.setattr(inloop, "ClientGenerator", Slow)
    monkeypatch.setattr(inloop, "POLL_S", 0.01)

    async def main():
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(inloop.evaluator, rt, stop)
            await anyio.sleep(0.05)
            rt.state.version = rt.state.step = 2
            for _ in range(200):
                await anyio.sleep(0.02)
                if sum(kind == "eval" for _, kind, _ in rt.tel.records) >= 2:
                    break
            stop.set()

    anyio.run(main)
    evals = [vals for _, kind, vals in rt.tel.records if kind == "eval"]
    assert [v["eval/policy_version"] for v in evals] == [2, 5]
    assert evals[0]["eval/policy_version_end"] == 5 and "eval/due_version" not in evals[0]
    assert evals[1]["eval/due_version"] == 4 and evals[1]["eval/boundaries_folded"] == 1
    events = [vals["message"] for _, kind, vals in rt.tel.records if kind == "event"]
    assert len(events) == 1 and "boundary v4 passed" in events[0] and "evaluating v5" in events[0]
