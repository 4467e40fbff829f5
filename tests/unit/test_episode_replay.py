"""Recorded episodes replay in the sandbox: every observation and reward matches; a
tampered record, changed code or a nondeterministic memory environment is caught."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import anyio
import msgspec
import numpy as np
import pytest

from spade_async import recipe
from spade_async.cli import main as spade
from spade_async.envs.pool import EnvPool
from spade_async.episodes import records as R
from spade_async.episodes.replay import read_summary, replay_records, summarize
from spade_async.generation.client import GenerateResult
from spade_async.loop import cycle
from spade_async.memory.records import Origin, make_record
from spade_async.memory.store import MemoryStore
from spade_async.roles.agent import EnvRef
from spade_async.rundir import RunDir
from spade_async.telemetry.metrics import Meters

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "spade_async" / "envs" / "examples"
ENVS = [
    EXAMPLES / "mastermind.py",
    EXAMPLES / "modular_lock.py",
    ROOT / "tests" / "integration" / "envs" / "lower_share.py",
]
# unseeded module-level randomness: a fresh worker draws another secret
FLAKY = """
import random

class FlakyEnv:
    def __init__(self, max_turns=4, **kw):
        self.secret = random.randrange(10**9)

    def reset(self, seed=None):
        self.t = 0
        return f"secret {self.secret}", {}

    def step(self, action):
        self.t += 1
        return f"turn {self.t} of {self.secret}", 0.1 * self.t, self.t >= 3, False, {}
"""


class ScriptedClient:
    """Replies drawn from the request's sampling seed: varied, reproducible actions."""

    async def generate(self, input_ids, sampling, **kw):
        rng = random.Random(sampling.sampling_seed)
        cmd = rng.choice(
            [f"guess {rng.randrange(1111, 6667)}", f"mod {rng.choice([3, 5, 7, 11, 13])}",
             f"open {rng.randrange(100)}", f"{rng.randrange(10)}", "nonsense"]
        )  # fmt: skip
        text = f"I try \\boxed{{{cmd}}}"
        return GenerateResult(
            output_ids=[5, 6, 7], logprobs=[-0.1] * 3, finish_reason="stop", matched=None,
            text=text, weight_version="2", prompt_tokens=len(input_ids), url="scripted",
        )  # fmt: skip

    def end_session(self, key):
        pass


CRASHY = """
import os, time

class CrashyEnv:
    def __init__(self, max_turns=4, **kw):
        self.t = 0

    def reset(self, seed=None):
        self.t = 0
        self.seed = seed or 0
        return f"seed {seed}", {}

    def step(self, action):
        self.t += 1
        if self.t == 2 and self.seed % 2:
            os._exit(3)  # a crash on odd seeds
        if self.t == 2:
            time.sleep(30)  # a hang on even seeds: the call times out
        return f"turn {self.t}", 0.0, False, False, {}
"""


def _record_run(tmp_path, tokenizer_path, sources: list[str], extra=()) -> RunDir:
    """A run directory whose memory holds ``sources`` and whose episodes the loop's own
    ``cycle.play`` recorded."""
    from transformers import AutoTokenizer

    cfg = recipe.load(
        None,
        ["agent.plays_nohint=3", "agent.plays_hint=2", "agent.max_turns=4", "envs.prewarm=0",
         "envs.max_workers=4", "audit.share=0.0", *extra],  # every slot a recorded play
    )  # fmt: skip
    run_dir = RunDir(tmp_path / "run").create()
    run_dir.write_config(cfg)
    refs = []
    with MemoryStore(run_dir.memory, cfg.memory) as store:
        for src in sources:
            rec = make_record(
                src, origin=Origin(kind="pool"), valid=True, stage="ok", skill="Logical_Deduction"
            )
            store.put(rec)
            refs.append(EnvRef(env_id=rec.id, source=rec.code))

    async def main():
        async with EnvPool(cfg.envs) as pool:
            rt = SimpleNamespace(
                cfg=cfg, rng=np.random.default_rng(0), pool=pool, client=ScriptedClient(),
                tokenizer=AutoTokenizer.from_pretrained(tokenizer_path), run_dir=run_dir,
                meters=Meters(), state=SimpleNamespace(step=1),
            )  # fmt: skip
            return await cycle.play(rt, refs, {r.env_id: "a hint" for r in refs}, version=2)

    episodes = anyio.run(main)
    assert len(episodes) == 5 * len(sources)
    return run_dir


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tokenizer_path):
    return _record_run(
        tmp_path_factory.mktemp("rec"), tokenizer_path, [p.read_text() for p in ENVS]
    )


def test_every_recorded_episode_replays_exactly(recorded):
    recs, bad = R.read_records(recorded.root)
    assert bad == 0 and len(recs) == 15
    assert len({r.id for r in recs}) == 15
    assert all(r.turn_versions and set(r.turn_versions) == {2} for r in recs)
    assert all(len(r.obs_hashes) == len(r.actions) + 1 for r in recs)
    assert any(len(r.actions) > 1 for r in recs) and any(r.hinted for r in recs)
    assert len({tuple(r.step_rewards) for r in recs}) > 1  # varied play, not one script
    outcomes = anyio.run(lambda: replay_records(recorded.root, recs))
    assert [o.verdict for o in outcomes] == ["exact"] * 15, outcomes
    # the command line: --all writes the summary spade report reads, exit 0
    assert spade(["episode", "replay", str(recorded.root), "--all"]) == 0
    summary = read_summary(recorded.root)
    assert summary.checked == 15 and summary.share == 1.0 and not summary.flagged_envs


def test_a_tampered_record_is_a_mismatch_at_its_call(recorded, tmp_path, capsys):
    recs, _ = R.read_records(recorded.root)
    long = next(r for r in recs if len(r.actions) >= 2)
    rewards = list(long.step_rewards)
    rewards[1] += 0.5
    hashes = list(long.obs_hashes)
    hashes[0] = "0" * 64
    cases = [
        msgspec.structs.replace(long, id="bad-reward", step_rewards=rewards),
        msgspec.structs.replace(long, id="bad-reset", obs_hashes=hashes),
        msgspec.structs.replace(long, id="bad-seed", seed=long.seed + 1),
        msgspec.structs.replace(long, id="bad-code", code_sha256="f" * 64),
        msgspec.structs.replace(long, id="no-env", env_id="0" * 64),
    ]
    out = anyio.run(lambda: replay_records(recorded.root, cases))
    by = {o.id: o for o in out}
    assert (by["bad-reward"].verdict, by["bad-reward"].call) == ("mismatch", 2)
    assert (by["bad-reset"].verdict, by["bad-reset"].call) == ("mismatch", 0)
    assert by["bad-code"].verdict == "code_changed"
    assert by["no-env"].verdict == "no_code"
    # one episode by id through the command line: exit 0 exact, 1 for a tampered copy
    assert spade(["episode", "replay", str(recorded.root), long.id]) == 0
    R.append(recorded.root, [cases[0]])
    try:
        assert spade(["episode", "replay", str(recorded.root), "bad-reward"]) == 1
        assert "mismatch at call 2" in capsys.readouterr().out
    finally:  # leave the module's run as it was
        path = R.records_path(recorded.root)
        path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:-1]))


def test_a_record_the_pool_cut_before_its_reset_replays_as_far_as_it_goes(recorded):
    """An instance lost with its worker (a sibling crashed it) before its reset answered holds
    no observation: it replays exactly (nothing after the cut to compare); a record whose own
    reset failed, when the replay's succeeds, is a mismatch at call 0."""
    recs, _ = R.read_records(recorded.root)
    base = recs[0]
    cut = dict(obs_hashes=[], actions=[], step_rewards=[], step_flags=[])
    cases = [
        msgspec.structs.replace(base, id="lost-at-reset", error_kind="lost", **cut),
        msgspec.structs.replace(base, id="crash-at-reset", error_kind="crash", **cut),
    ]
    by = {o.id: o for o in anyio.run(lambda: replay_records(recorded.root, cases))}
    assert by["lost-at-reset"].verdict == "exact"
    assert (by["crash-at-reset"].verdict, by["crash-at-reset"].call) == ("mismatch", 0)


def test_a_memory_environment_that_no_longer_replays_is_flagged(tmp_path, tokenizer_path, capsys):
    run = _record_run(tmp_path, tokenizer_path, [ENVS[0].read_text(), FLAKY])
    assert spade(["episode", "replay", str(run.root), "--all"]) == 1
    text = capsys.readouterr().out
    summary = read_summary(run.root)
    flaky = make_record(FLAKY, origin=Origin(kind="pool"), valid=True, stage="ok").id
    assert summary.flagged_envs == {flaky: 5}, summary.flagged_envs
    assert summary.exact == 5 and summary.checked == 10
    assert f"flagged: memory environment {flaky[:12]} no longer replays (5 episode(s))" in text


def test_bad_input_is_a_one_line_usage_error(tmp_path, capsys):
    assert spade(["episode", "replay", str(tmp_path / "nope"), "--all"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    assert spade(["episode", "replay", str(tmp_path / "run"), "--all"]) == 2
    assert "no episode records" in capsys.readouterr().err
    assert spade(["episode", "replay", str(tmp_path / "run"), "abc"]) == 2
    assert "no episode 'abc'" in capsys.readouterr().err
    # a torn last line (a kill mid-write) is skipped, the rest reads
    R.append(tmp_path / "run", [])
    path = R.records_path(tmp_path / "run")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"id": "x"')
    assert R.read_records(tmp_path / "run") == ([], 1)
    assert summarize([]).share == 0.0


def test_replay_records_share_chooses_by_environment_and_seed(tmp_path):
    share = [R.chosen("e" * 64, seed, 0.25) for seed in range(4000)]
    assert 0.22 < sum(share) / len(share) < 0.28  # binomial sd 0.007
    assert share == [R.chosen("e" * 64, seed, 0.25) for seed in range(4000)]  # deterministic
    assert all(R.chosen("x", s, 1.0) for s in range(50))
    assert not any(R.chosen("x", s, 0.0) for s in range(50))
    cfg = recipe.load(None, ["telemetry.replay_records=0.0"])
    rt = SimpleNamespace(cfg=cfg, state=SimpleNamespace(step=0),
                         run_dir=RunDir(tmp_path / "r").create())  # fmt: skip
    ep = SimpleNamespace(env_id="e", seed=1)
    assert R.log_episode(rt, EnvRef("e", "src"), ep) is None
    assert not R.records_path(rt.run_dir.root).exists()
    with pytest.raises(Exception, match="replay_records"):
        recipe.load(None, ["telemetry.replay_records=1.5"])


def test_an_environment_that_crashed_or_hung_replays_its_failure(tmp_path, tokenizer_path):
    one_at_a_time = ["envs.call_timeout_s=2", "max_concurrent_episodes=1"]
    run = _record_run(tmp_path / "a", tokenizer_path, [CRASHY], extra=one_at_a_time)
    recs, _ = R.read_records(run.root)
    assert {r.error_kind for r in recs} == {"crash", "timeout"}, [r.error_kind for r in recs]
    assert all(len(r.obs_hashes) == 2 and len(r.actions) == 2 for r in recs)
    outcomes = anyio.run(lambda: replay_records(run.root, recs))
    assert [o.verdict for o in outcomes] == ["exact"] * len(recs), outcomes
    # a recorded failure that does not happen again is a mismatch at that call
    fine = msgspec.structs.replace(recs[0], error_kind="", id="no-error")
    (out,) = anyio.run(lambda: replay_records(run.root, [fine]))
    assert (out.verdict, out.call) == ("mismatch", 2)  # the second step raised
    # concurrent plays share the environment's worker: one crash loses the others' instances
    # ("lost", the pool's doing); those records replay up to where they were cut
    run = _record_run(tmp_path / "b", tokenizer_path, [CRASHY], extra=["envs.call_timeout_s=2"])
    recs, _ = R.read_records(run.root)
    assert "lost" in {r.error_kind for r in recs}, [r.error_kind for r in recs]
    outcomes = anyio.run(lambda: replay_records(run.root, recs))
    assert [o.verdict for o in outcomes] == ["exact"] * len(recs), outcomes
