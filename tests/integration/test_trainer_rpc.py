"""The rank-0 RPC through real torchrun'd ranks (gloo on CPU)."""

from __future__ import annotations

import math
import os
import signal
import time

import pytest

from spade_async.trainer.batch import Batch, BatchError, Sample
from spade_async.trainer.client import TrainerDied
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.launch import TrainerProcess


def _batch(n: int = 4) -> Batch:
    samples = []
    for i in range(n):
        ids = [1 + i, 20 + i, 300 + i, 4000 + i, 50 + i]
        samples.append(
            Sample(
                token_ids=ids,
                loss_mask=[0, 0, 1, 1, 1],
                advantage=1.0 if i % 2 else -1.0,
                rollout_logprobs=[0.0, 0.0, -10.8, -10.8, -10.8],
                role="agent",
            )
        )
    return Batch(samples=samples)


def _cfg(model) -> TrainerConfig:
    return TrainerConfig(model=str(model), lr=1e-3, micro_batch_tokens=12, start_timeout_s=120)


def test_rpc_round_trip_world_size_1(tiny_model, tmp_path):
    with TrainerProcess(_cfg(tiny_model), tiny_model, tmp_path / "run", nproc=1) as client:
        pong = client.ping()
        assert pong.world_size == 1 and pong.version == 0 and len(pong.pids) == 1
        m = client.train_step(_batch())
        assert m["version"] == 1.0 and m["skipped"] == 0.0 and math.isfinite(m["loss"])
        assert m["tokens"] == 20.0 and m["loss_tokens"] == 12.0 and m["micro_batches"] >= 2
        bad = Batch(
            samples=[
                *_batch(2).samples,
                Sample(
                    token_ids=[1, 2],
                    loss_mask=[0, 1],
                    advantage=math.nan,
                    rollout_logprobs=[0.0, -1.0],
                ),
            ]
        )
        with pytest.raises(BatchError, match=r"sample 2 \(agent\): advantage is nan"):
            client.train_step(bad)
        assert client.ping().version == 1  # the bad batch stepped nothing
        saved = client.save(str(tmp_path / "ck"), hf_directory=str(tmp_path / "hf"))
        assert saved.version == 1 and (tmp_path / "hf" / "model.safetensors").is_file()
    assert not os.path.exists(tmp_path / "run" / "trainer.sock")


def test_two_gloo_ranks_step_and_dead_rank_is_reported(tiny_model, tmp_path):
    proc = TrainerProcess(_cfg(tiny_model), tiny_model, tmp_path / "run", nproc=2)
    client = proc.start()
    try:
        pong = client.ping()
        assert pong.world_size == 2 and len(set(pong.pids)) == 2
        m = client.train_step(_batch(6))
        assert m["version"] == 1.0 and m["tokens"] == 30.0 and math.isfinite(m["grad_norm"])
        # the same batch on one in-process rank in float64: same loss and global gradient
        # norm, to the fp32 rounding of the two ranks (numerics.py)
        from numerics import reduction_bound

        from spade_async.trainer.step import Trainer

        ref = Trainer(_cfg(tiny_model), tiny_model)
        ref.model.double()
        one = ref.train_step(_batch(6))
        cfg, batch = _cfg(tiny_model), _batch(6)
        rel = reduction_bound(ref.vocab_size, int(m["loss_tokens"]))
        # loss = -mean(adv * w * ratio) with ratio 1 (detached old log-probs) and the
        # truncated weight w <= tis_cap: a log-prob error d moves it by <= mean|adv| cap d.
        # The ±1 advantages cancel (|loss| ~ 1e-3), so this scale, not |loss|, is the bound.
        adv = [abs(s.advantage) for s in batch.samples for k in s.loss_mask if k]
        assert abs(m["loss"] - one["loss"]) <= rel * cfg.tis_cap * sum(adv) / len(adv)
        assert abs(m["grad_norm"] - one["grad_norm"]) <= rel * one["grad_norm"]
        os.kill(pong.pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(TrainerDied, match="exited with status"):
            for _ in range(100):  # torchrun notices within a second; never wait forever
                client.train_step(_batch())
                time.sleep(0.1)
        assert time.monotonic() - t0 < 60
        assert proc.alive() is not None
    finally:
        proc.kill()
