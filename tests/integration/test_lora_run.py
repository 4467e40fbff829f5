"""The whole loop with ``trainer.lora`` on a CPU engine (loop/lora.py): engines serve the
frozen base plus one adapter per version, every push is adapter-only, every request names
the newest adapter, a sample's policy version is its adapter's, and a resumed run loads its
checkpoint's adapter before it generates. The engine's call log (SPADE_ENGINE_TRACE, the
autouse recorder) holds every LoRA call and every request on an adapter; any refusal fails."""

from __future__ import annotations

import json

import pytest
from loop_helpers import _config, _run, _steps

from spade_async import recipe
from spade_async.loop import cycle
from spade_async.rundir import RunDir
from spade_async.trainer.client import AsyncTrainerClient

LORA = "{rank=4,alpha=8.0,target_modules=['q_proj','v_proj']}"


def _calls(files) -> list[dict]:
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def _lora_calls(calls) -> list[tuple[str, str]]:
    """(path, adapter name) of the LoRA calls and the requests on an adapter, in order."""
    out = []
    for c in calls:
        if c["path"] in ("/load_lora_adapter", "/unload_lora_adapter"):
            out.append((c["path"], c["message"].removeprefix("lora_name=")))
        elif c["path"] == "/generate":
            out.append((c["path"], c["message"].removeprefix("lora_path=")))
    return out


@pytest.mark.slow  # ~70 s on 2 cores: two runs (3 steps, then 1 resumed)
@pytest.mark.timeout(600)
def test_lora_run_pushes_adapters_names_them_and_resumes(
    tiny_model, tmp_path, engine_trace, monkeypatch
):
    pushes: list[dict] = []
    real_push = AsyncTrainerClient.push_weights

    async def spy_push(self, engines, **kw):
        pushes.append(kw)
        return await real_push(self, engines, **kw)

    trained: list[tuple[int, list[int]]] = []  # (trainer version, sample policy versions)
    real_train = cycle.train_and_push

    async def spy_train(rt, samples, **kw):
        trained.append((rt.state.version, [s.policy_version for s in samples]))
        return await real_train(rt, samples, **kw)

    monkeypatch.setattr(AsyncTrainerClient, "push_weights", spy_push)
    monkeypatch.setattr(cycle, "train_and_push", spy_train)
    # max_staleness 0: a sample whose version were read from SGLang's weight_version (which
    # adapter loads leave at the base's "0") would be dropped from step 2 on
    cfg = _config(
        tiny_model,
        tmp_path,
        "fixed_pool",
        **{"trainer.lora": LORA, "max_staleness": "0", "max_steps": "3", "trainer.lr": "1e-2"},
    )
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)
    first_files = sorted(engine_trace.glob("*.jsonl"))
    assert len(first_files) == 1, "one engine"

    # every push sent only the adapter, one per step
    assert [p["mode"] for p in pushes] == ["lora"] * 3
    calls = _calls(first_files)
    assert not [c for c in calls if c["path"].startswith("/update_weights")], "no full push"
    seq = _lora_calls(calls)
    loads = [n for p, n in seq if p == "/load_lora_adapter"]
    assert loads == ["spade-v1", "spade-v2", "spade-v3"]
    assert [n for p, n in seq if p == "/unload_lora_adapter"] == ["spade-v1", "spade-v2"]
    # after each load every request names that adapter (until the next load)
    current = None
    on_adapter = 0
    for p, n in seq:
        if p == "/load_lora_adapter":
            current = n
        elif p == "/generate":
            assert n == current, seq
            on_adapter += 1
    assert on_adapter > 0, "requests ran on the adapters"
    # each step trained samples of exactly the version it was at: the adapter they ran on
    assert [v for v, _ in trained] == [0, 1, 2]
    for version, sample_versions in trained:
        assert sample_versions and set(sample_versions) == {version}, trained
    steps = _steps(run_dir)
    assert [r["batch/versions"] for r in steps] == [[0], [1], [2]]
    assert all(r.get("staleness/dropped", 0) == 0 for r in steps)

    # resume: fresh engines serve the base; the checkpoint's adapter is loaded before any
    # request, so nothing generated after the resume is the base claiming version 3
    pushes.clear()
    trained.clear()
    _run(recipe.load(run_dir.config, ["max_steps=4"]), run_dir)
    new_files = sorted(set(engine_trace.glob("*.jsonl")) - set(first_files))
    seq = _lora_calls(_calls(new_files))
    assert seq[0] == ("/load_lora_adapter", "spade-v3"), seq[:3]
    assert [p["mode"] for p in pushes] == ["lora"] * 2  # the resume's, then step 4's
    assert trained and trained[0][0] == 3 and set(trained[0][1]) == {3}, trained
    assert _steps(run_dir)[-1]["staleness/dropped"] == 0


@pytest.mark.slow  # ~60 s on 2 cores
@pytest.mark.timeout(600)
def test_async_lora_versions_are_the_adapters_and_nothing_is_refused(
    tiny_model, tmp_path, engine_trace, monkeypatch
):
    """The async schedule keeps requests in flight across pushes: a group played from
    version v has every turn at version >= v (the adapter current when each request
    started; SGLang's weight_version stays "0"), no request is refused its adapter though
    old adapters are unloaded while others generate (the autouse recorder), and with
    max_staleness 0 every trained sample is of the trainer's version."""
    import shutil

    from loop_helpers import HERE

    pool = tmp_path / "pool"
    pool.mkdir()
    shutil.copy(HERE / "envs" / "first_letter.py", pool / "first_letter.py")
    played: list[tuple[int, list[int]]] = []  # (state version at the start, turn versions)
    real_play = cycle.play

    async def spy_play(rt, envs, hints, version, *a, **kw):
        start = rt.state.version
        episodes = await real_play(rt, envs, hints, version, *a, **kw)
        played.append((start, [v for e in episodes for v in e.turn_versions]))
        return episodes

    monkeypatch.setattr(cycle, "play", spy_play)
    cfg = recipe.load(
        None,
        [
            "mode='fixed_pool'",
            "schedule='async'",
            f"model='{tiny_model}'",
            "max_steps=4",
            "replay_envs=1",
            "initial_memory=''",
            f"fixed_pool='{pool}'",
            "checkpoint_every=100",
            "max_staleness=0",
            "agent.plays_nohint=8",
            "agent.max_turns=1",
            "agent.max_turn_tokens=2",
            "agent.cut_reply='step'",
            "agent.temperature=1.0",
            f"trainer.lora={LORA}",
            "trainer.lr=1e-2",
            "telemetry.dashboard='off'",
            "envs.max_workers=2",
            "pipeline.groups_in_flight=2",
            "pipeline.queue_groups=2",
        ],
    )
    run_dir = RunDir(tmp_path / "run")
    _run(cfg, run_dir)
    steps = _steps(run_dir)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    final = steps[-1]["version"]
    assert final == 4
    assert any(start > 0 for start, _ in played), "groups were played from pushed adapters"
    for start, versions in played:
        assert versions and all(start <= v <= final for v in versions), played
    assert all(r["batch/max_agent_age"] == 0 for r in steps)
    seq = _lora_calls(_calls(sorted(engine_trace.glob("*.jsonl"))))
    assert [n for p, n in seq if p == "/load_lora_adapter"] == [f"spade-v{i}" for i in (1, 2, 3, 4)]
    assert len([1 for p, _ in seq if p == "/unload_lora_adapter"]) >= 2
