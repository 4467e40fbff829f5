"""Version accounting when the trainer dies: wherever the death lands (before a step, mid-step,
mid-push), the final policy version equals the steps run minus the lost batches and versions.

The real ``train_and_push`` and ``Runtime.restart_trainer`` run against a scripted trainer; the
integration test (tests/integration/test_signals.py) kills a real trainer, but where its kill
lands is up to timing, so each landing point is pinned here."""

from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

import spade_async.loop.runtime as runtime_mod
from spade_async.loop.cycle import train_and_push
from spade_async.loop.runtime import Runtime
from spade_async.telemetry.metrics import Meters
from spade_async.trainer.client import TrainerDied
from spade_async.trainer.rpc import WeightsPushed


class ScriptedTrainer:
    """Holds a policy version like the real trainer: +1 per trained step; dies when told."""

    def __init__(self, version: int, die: dict):
        self.version, self.die = version, die

    def _maybe_die(self, where: str) -> None:
        if self.die.get(where):
            self.die[where] = False
            raise TrainerDied(f"killed {where}")

    async def train_step(self, batch):
        self._maybe_die("train")
        self.version += 1
        return {"loss": 0.0}


def _runtime(tmp_path: Path, die: dict, monkeypatch) -> SimpleNamespace:
    checkpoints: dict[int, int] = {}  # step -> the trainer version it holds
    rt = SimpleNamespace(
        cfg=SimpleNamespace(trainer_restarts=2, model="m"),
        model_dir="m",
        trainer_restarts=0,
        meters=Meters(),
        release_memory=False,
        state=SimpleNamespace(version=0, step=0),
        trainer_proc=SimpleNamespace(stop=lambda timeout: None),
        tel=SimpleNamespace(event=lambda step, msg: rt.events.append(msg)),
        events=[],
        checkpoints=checkpoints,
    )
    rt.trainer = ScriptedTrainer(0, die)

    def latest_checkpoint():
        if not checkpoints:
            return None
        step = max(checkpoints)
        return step, tmp_path / f"step-{step:05d}"

    rt.run_dir = SimpleNamespace(latest_checkpoint=latest_checkpoint, root=tmp_path)

    async def push(*, pause):
        rt.trainer._maybe_die("push")
        rt.state.version = rt.trainer.version
        return WeightsPushed(version=rt.trainer.version, engines={}, seconds=0.0)

    rt.push = push

    async def restart_trainer(why, *, pause=False):
        await Runtime.restart_trainer(rt, why, pause=pause)

    rt.restart_trainer = restart_trainer

    def trainer_process(cfg, model, root, *, load):
        version = checkpoints[int(Path(load).name.split("-")[1])] if load else 0
        return SimpleNamespace(start=lambda: ScriptedTrainer(version, die))

    monkeypatch.setattr(runtime_mod, "trainer_process", trainer_process)
    monkeypatch.setattr(runtime_mod, "AsyncTrainerClient", lambda started: started)
    return rt


@pytest.mark.parametrize("where", ["train", "push", "nowhere"])
def test_versions_account_for_a_dead_trainer(tmp_path, monkeypatch, where):
    die: dict = {}
    rt = _runtime(tmp_path, die, monkeypatch)
    samples = [SimpleNamespace(token_ids=[1, 2, 3])]

    async def run():
        for step in range(1, 6):
            rt.state.step = step
            if step == 4:
                die[where] = True
            await train_and_push(rt, samples, pause=False)
            if step % 2 == 0:  # checkpoints follow the push, as in cycle.py
                rt.checkpoints[step] = rt.trainer.version

    anyio.run(run)
    c = rt.meters.counters
    lost = c.get("train/lost_batches", 0) + c.get("trainer/lost_versions", 0)
    assert rt.state.version == 5 - lost
    assert rt.trainer.version == rt.state.version  # the engines serve the trainer's version
    if where == "nowhere":
        assert lost == 0 and c.get("trainer/restarts", 0) == 0
    else:  # the step-4 batch is lost either way; the checkpoint at step 2 covers the rest
        assert c["trainer/restarts"] == 1 and c["train/lost_batches"] == 1
        assert c.get("trainer/lost_versions", 0) == 1  # step 3's version, after checkpoint 2
        assert "restarted from checkpoint step 2" in rt.events[-1]


def test_a_refused_push_loses_the_batch_and_the_run_goes_on(tmp_path, monkeypatch):
    """An engine refused the push (trainer-side WeightPushError, PushRefused here): one
    event naming engine, route and message; the batch counts as lost; the engines keep
    their version, and the next push (all weights) brings them to the trainer's."""
    from spade_async.trainer.client import _ERRORS, PushRefused
    from spade_async.trainer.weights import WeightPushError

    assert _ERRORS[WeightPushError.__name__] is PushRefused  # the RPC error kind's class
    rt = _runtime(tmp_path, {}, monkeypatch)
    refusals = ["engine http://a refused POST /update_weights_from_distributed (HTTP 400): x"]
    good_push = rt.push

    async def push(*, pause):
        if refusals:
            raise PushRefused(refusals.pop())
        return await good_push(pause=pause)

    rt.push = push
    sample = SimpleNamespace(token_ids=[1, 2, 3])

    async def main():
        first = await train_and_push(rt, [sample], pause=False)
        second = await train_and_push(rt, [sample], pause=False)
        return first, second

    first, second = anyio.run(main)
    assert "push_s" not in first and "push_s" in second
    assert rt.meters.counters["train/lost_batches"] == 1
    assert rt.meters.counters["push/refused"] == 1
    assert any("/update_weights_from_distributed" in e and "refused" in e for e in rt.events)
    assert rt.state.version == rt.trainer.version == 2
