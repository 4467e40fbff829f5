"""Audits inside training (loop/audits.py, envs/audit.py): environments that play fair under
the gates and unfair in training are quarantined within two groups of first use, by a
scripted play through the real sandboxed pool; an honest environment is not; scripted plays
call no engine and never reach the episodes; quarantine is a memory status that survives
reopening and shows in ``spade memory ls``."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import anyio
import numpy as np
import pytest

from spade_async import recipe
from spade_async.envs.pool import EnvPool, PoolConfig
from spade_async.envs.validate import validate_source
from spade_async.generation.client import GenerateResult
from spade_async.loop import audits, cycle
from spade_async.loop.runtime import ControllerState
from spade_async.memory.records import Origin, make_record
from spade_async.memory.sampling import replay_sample
from spade_async.memory.store import MemoryStore
from spade_async.memory.writer import MemoryWriter
from spade_async.telemetry.metrics import Meters

ROOT = Path(__file__).parents[2]
HOSTILE = ROOT / "tests" / "hostile"
TRAINING = ROOT / "tests" / "hostile_training"  # tell training by call pattern
OLD = ("probe_aware", "garbage_wins_late")  # from the gates' corpus (tests/hostile)
HONEST = ROOT / "spade_async" / "envs" / "examples" / "mastermind.py"


def test_plan_slots_share_minimum_and_never_all():
    rng = random.Random(0)
    assert audits.plan_slots(rng, 1, 0.5, 1) == []  # a lone slot stays real
    assert audits.plan_slots(rng, 16, 0.0, 1) == []  # share 0: audits off
    for n in (2, 3, 16):
        for _ in range(50):
            s = audits.plan_slots(rng, n, 0.0625, 1)
            assert 1 <= len(s) <= n - 1 and len(set(s)) == len(s)
    # the expected count is share x n (the fraction is a coin): 0.3 x 10 = 3 exactly
    assert {len(audits.plan_slots(rng, 10, 0.3, 0)) for _ in range(20)} == {3}
    counts = [len(audits.plan_slots(rng, 10, 0.25, 0)) for _ in range(400)]
    assert set(counts) == {2, 3} and 0.35 < counts.count(3) / 400 < 0.65


class _Client:
    """Replies that box a random word and number after a short 'generation' wait (0.2 s:
    training's turn gaps are seconds); counts its calls."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.calls = 0

    async def generate(self, input_ids, sampling, **kw):
        self.calls += 1
        await anyio.sleep(0.2)
        word = self.rng.choice(("up", "left", "guess", "move", "pick"))
        return GenerateResult(
            output_ids=[5, 6, 7], logprobs=[-0.1] * 3, finish_reason="stop", matched=None,
            text=f"\\boxed{{{word} {self.rng.randint(0, 99)}}}", weight_version="0",
            prompt_tokens=len(input_ids), url="fake",
        )  # fmt: skip

    def end_session(self, key):
        pass


class _Tel:
    def __init__(self) -> None:
        self.events: list[str] = []

    def event(self, step, message, level="info"):
        self.events.append(message)


def _record(path: Path):
    return make_record(
        path.read_text(), origin=Origin(kind="pool"), valid=True, stage="ok", skill="games"
    )


async def _runtime(tmp_path: Path, pool: EnvPool, store: MemoryStore, writer, tokenizer, **kw):
    overrides = [
        "agent.plays_nohint=4", "agent.plays_hint=0", "agent.max_turn_tokens=8",
        "max_concurrent_episodes=8", "telemetry.replay_records=0.0",
    ] + [f"{k}={v}" for k, v in kw.items()]  # fmt: skip
    cfg = recipe.load(None, overrides)
    return SimpleNamespace(
        cfg=cfg, pool=pool, store=store, writer=writer, tokenizer=tokenizer,
        client=_Client(), meters=Meters(), tel=_Tel(), state=ControllerState(),
        rng=np.random.default_rng(0), run_dir=SimpleNamespace(root=tmp_path),
    )  # fmt: skip


def _train_rounds(
    tmp_path, tokenizer_path, hostile: Path, rounds: int, max_turns: int, call_timeout_s=5.0
):
    """``rounds`` play groups of the hostile environment beside an honest one, as the sync
    schedule plays them (one cycle.play per step). Returns (verdict, runtime, episodes,
    the round it was quarantined in or None, its memory record)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    bad, good = _record(hostile), _record(HONEST)

    async def main():
        # one worker per environment: a group's instances share it, as a fast environment's
        # do (spread over workers, an instance-count-aware one is unfair only in some)
        pc = PoolConfig(max_workers=6, prewarm=1, workers_per_env=1, call_timeout_s=call_timeout_s)
        async with EnvPool(pc) as pool:
            verdict = await validate_source(hostile.read_text(), pool=pool, setting="games")
            with MemoryStore(tmp_path / "memory.lmdb") as store:
                writer = MemoryWriter(store)
                async with anyio.create_task_group() as tg:
                    await tg.start(writer.run)
                    await writer.put(bad)
                    await writer.put(good)
                    rt = await _runtime(
                        tmp_path, pool, store, writer, tok, **{"agent.max_turns": max_turns}
                    )
                    envs = cycle.env_refs(rt, [bad.id, good.id])
                    episodes, caught = [], None
                    for r in range(rounds):
                        rt.state.step = r
                        eps = await cycle.play(rt, envs, {}, 0, 4)
                        episodes += eps
                        if caught is None and audits.is_quarantined(rt, bad.id):
                            caught = r
                    kept = audits.drop_quarantined(rt, episodes)
                    writer.close()
                    tg.cancel_scope.cancel()
                return verdict, rt, episodes, kept, caught, store.get(bad.id), store.get(good.id)

    return anyio.run(main)


@pytest.mark.parametrize(
    "name, max_turns, reason",
    [
        ("close_aware", 5, "solution_lost"),
        ("timing_aware", 5, "solution_lost"),
        ("instance_count_aware", 5, "garbage_won"),
        ("probe_aware", 5, "garbage_won"),
        ("garbage_wins_late", 12, "garbage_won"),
        ("reset_count_aware", 5, "garbage_won"),  # the gates reject it too (one reset each)
    ],
)
def test_unfair_in_training_is_quarantined_within_two_groups(
    tmp_path, tokenizer_path, name, max_turns, reason
):
    path = (HOSTILE if name in OLD else TRAINING) / f"{name}.py"
    verdict, rt, episodes, kept, caught, bad, good = _train_rounds(
        tmp_path, tokenizer_path, path, 2, max_turns
    )
    snap = rt.meters.snapshot()
    # caught by the gates, or quarantined by an audit within its first two groups
    assert not verdict.valid or caught is not None, (verdict, snap)
    if caught is not None:
        assert bad.status == "quarantined" and bad.quarantine.startswith(reason), bad.quarantine
        assert bad.quarantine_step == caught
        assert snap[f"audit/quarantined/{reason}"] == 1
        assert all(e.env_id != bad.id for e in kept)  # its untrained samples are dropped
        assert snap["audit/dropped_samples"] == sum(e.env_id == bad.id for e in episodes)
        assert any(bad.id[:12] in m for m in rt.tel.events)
    assert good.status == "valid" and not good.quarantine  # no false quarantine
    assert "audit/failed/solution_lost" not in snap or reason == "solution_lost"
    # scripted plays are never episodes and never call the engine: 2 rounds x 2 envs x 4
    # slots, at least one scripted per group; every real turn is one engine call
    # (a slot where no audit could run is played for real: not lost)
    assert len(episodes) + snap["audit/run"] == 2 * 2 * 4 or caught is not None
    assert rt.client.calls == sum(e.turns for e in episodes)


def test_honest_environments_are_never_quarantined(tmp_path, tokenizer_path):
    """Two honest environments (examples) over 3 rounds: both audit kinds run, none fails."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    recs = [
        _record(ROOT / "spade_async/envs/examples" / n)
        for n in ("mastermind.py", "modular_lock.py")
    ]

    async def main():
        async with EnvPool(PoolConfig(max_workers=6, prewarm=1)) as pool:
            with MemoryStore(tmp_path / "memory.lmdb") as store:
                writer = MemoryWriter(store)
                async with anyio.create_task_group() as tg:
                    await tg.start(writer.run)
                    for r in recs:
                        await writer.put(r)
                    rt = await _runtime(
                        tmp_path, pool, store, writer, tok, **{"agent.max_turns": 6}
                    )
                    envs = cycle.env_refs(rt, [r.id for r in recs])
                    for step in range(3):
                        rt.state.step = step
                        await cycle.play(rt, envs, {}, 0, 4)
                    writer.close()
                    tg.cancel_scope.cancel()
                return rt.meters.snapshot(), [store.get(r.id).status for r in recs]

    snap, statuses = anyio.run(main)
    assert statuses == ["valid", "valid"]
    assert snap["audit/run"] >= 6 and snap.get("audit/failed", 0) == 0, snap
    assert snap["audit/run/solution"] >= 1 and snap["audit/run/garbage"] >= 1, snap


def test_quarantine_survives_reopen_and_shows_in_memory_ls(tmp_path):
    rec = _record(HONEST)

    async def main():
        with MemoryStore(tmp_path / "memory.lmdb") as store:
            writer = MemoryWriter(store)
            async with anyio.create_task_group() as tg:
                await tg.start(writer.run)
                await writer.put(rec)
                await writer.quarantine(rec.id, "garbage_won: replies win", 7)
                await writer.quarantine(rec.id, "solution_lost: later", 9)  # the first stays
                writer.close()
                tg.cancel_scope.cancel()

    anyio.run(main)
    with MemoryStore(tmp_path / "memory.lmdb") as store:  # reopened, as a resumed run does
        got = store.get(rec.id)
        assert got.status == "quarantined" and got.quarantine_step == 7
        assert got.quarantine.startswith("garbage_won")
        assert replay_sample(store, 4, version=0, rng=np.random.default_rng(0)) == []
        assert [r.id for r in store.records(status="quarantined")] == [rec.id]
        assert cycle.env_refs(SimpleNamespace(store=store), [rec.id]) == []
    out = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "memory", "ls", "--run", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "quarantined at step 7: garbage_won" in out.stdout, out.stdout
    js = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "memory", "ls", "--json", "--run", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    row = json.loads(js.stdout)[0]
    assert row["status"] == "quarantined" and row["quarantine_step"] == 7


@pytest.mark.parametrize(
    "name, kind", [("crash_in_training", "crash"), ("hang_in_training", "timeout")]
)
def test_crash_or_hang_under_audit_is_an_environment_failure(tmp_path, tokenizer_path, name, kind):
    """An environment whose step() kills its worker, or never returns, during a scripted
    play is quarantined (audit_fault, naming the failure), and the loop goes on."""
    verdict, rt, episodes, kept, caught, bad, good = _train_rounds(
        tmp_path, tokenizer_path, TRAINING / f"{name}.py", 2, 5, call_timeout_s=1.5
    )
    assert caught is not None and bad.quarantine.startswith("audit_fault"), bad.quarantine
    assert kind in bad.quarantine or "lost" in bad.quarantine, bad.quarantine
    assert good.status == "valid"


def test_quarantined_design_scores_the_invalid_reward_while_its_window_is_open():
    """The designer sample that wrote a quarantined environment scores 0 (a broken design's
    reward) however well its plays went; the other sample keeps its plays' score."""
    from spade_async.envs.validate import Verdict
    from spade_async.loop.design import Window, score_designs
    from spade_async.roles.designer import DesignSample

    cfg = recipe.load(None, [])
    rt = SimpleNamespace(cfg=cfg, state=SimpleNamespace(version=1, step=3, skill_ema={}),
                         meters=Meters())  # fmt: skip

    def ds(env):
        return DesignSample(
            prompt_ids=[1], output_ids=[2], logprobs=[-0.1], skill="s", doc_id=None, version=1,
            verdict=Verdict(valid=True, stage="ok", reason=""), env_id=env, duplicate=False,
        )  # fmt: skip

    def window():
        w = Window(samples=[ds("bad"), ds("good")])
        for env in ("bad", "good"):
            w.plain_plays[env] += [(1, 1.0), (1, 0.0)]
            w.hint_plays[env] += [(1, 1.0), (1, 1.0)]
        return w

    _, before, _, _ = score_designs(rt, window())
    assert before[0] == before[1] != 0.0  # the same plays: the same reward
    audits.auditor(rt).quarantined["bad"] = "garbage_won"
    _, after, _, _ = score_designs(rt, window())
    assert after[0] == 0.0 and after[1] == before[1]


def test_dashboard_and_report_show_audits_per_reason(tmp_path):
    from rich.console import Console

    from spade_async.report.data import Run, audit_outcomes
    from spade_async.telemetry import panels
    from spade_async.telemetry.dashboard import _State

    rec = {"step": 3, "audit/run": 9, "audit/run/solution": 5, "audit/run/garbage": 4,
           "audit/failed": 2, "audit/failed/garbage_won": 1, "audit/failed/audit_fault": 1,
           "audit/quarantined": 2, "audit/quarantined/garbage_won": 1,
           "audit/quarantined/audit_fault": 1, "audit/dropped_samples": 6}  # fmt: skip
    out = audit_outcomes(Run(root=tmp_path, steps=[rec]))
    assert out == {"run: solution": 5, "run: garbage": 4, "failed: audit_fault": 1,
                   "failed: garbage_won": 1, "quarantined: audit_fault": 1,
                   "quarantined: garbage_won": 1, "samples dropped": 6}  # fmt: skip
    assert audit_outcomes(Run(root=tmp_path, steps=[{"step": 1}])) == {}
    st = _State()
    st.update(rec)
    console = Console(width=120, record=True)
    console.print(panels.health(st))
    shown = console.export_text()
    for line in ("audits run", "audits failed", "environments quarantined",
                 "quarantined: garbage_won", "quarantined: audit_fault"):  # fmt: skip
        assert line in shown, shown


def test_garbage_is_a_reply_to_another_environment_made_absurd_here():
    """A legal move elsewhere (a small number, a direction) never stays one: numbers grow
    past any range, words inside the answer become random letters; the shape stays."""
    import re

    from spade_async.envs.audit import absurd

    rng = random.Random(0)
    for reply in ("\\boxed{5}", "I think \\boxed{left 3}.", "<answer>42 apples</answer>",
                  '<tool_call>{"name": "pay", "arguments": {"n": 3}}</tool_call>'):  # fmt: skip
        out = absurd(rng, reply)
        assert out != reply
        assert all(len(n) >= 6 for n in re.findall(r"\d+", out)), out
        assert "left" not in out and "apples" not in out and ("pay" in out) == ("pay" in reply)
        assert out.count("\\boxed{") == reply.count("\\boxed{")
    assert absurd(rng, "no answer here") == "no answer here"  # prose keeps its words


def test_a_slot_no_audit_can_fill_is_played_for_real(tmp_path, tokenizer_path):
    """max_turns 2: no solution fits an episode, and the first group has no garbage yet:
    the scripted slots are played by the agent instead (skipped, not lost)."""
    verdict, rt, episodes, kept, caught, bad, good = _train_rounds(
        tmp_path, tokenizer_path, HONEST, 1, 2
    )
    snap = rt.meters.snapshot()
    assert snap["audit/skipped"] >= 1 and snap.get("audit/run", 0) == 0, snap
    assert len(episodes) == 4  # (one environment here) every slot played by the agent
    assert caught is None and good.status == "valid"
