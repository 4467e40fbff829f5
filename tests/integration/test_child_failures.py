"""A child that dies at start says why: the exception, not "exited with status 1" (issue 32)."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from spade_async import failure
from spade_async.trainer.client import TrainerDied
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.launch import TrainerProcess

BANNER = "To enable traceback"


def _cfg(model) -> TrainerConfig:
    return TrainerConfig(model=str(model), lr=1e-3, micro_batch_tokens=12, start_timeout_s=120)


def _boom_site(tmp_path, rank: str) -> str:
    """A sitecustomize that makes one torchrun'd rank's Trainer raise RuntimeError('boom')."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
        import os
        if os.environ.get("RANK") == {rank!r}:
            import spade_async.trainer.step as step

            def boom(*args, **kwargs):
                raise RuntimeError("boom")

            step.Trainer.__init__ = boom
        """)
    )
    return str(site)


@pytest.mark.parametrize("nproc,rank", [(1, "0"), (2, "1")])
def test_a_rank_that_raises_at_start_names_its_exception(tiny_model, tmp_path, nproc, rank):
    env = {"PYTHONPATH": os.pathsep.join([_boom_site(tmp_path, rank), *sys.path])}
    proc = TrainerProcess(_cfg(tiny_model), tiny_model, tmp_path / "run", nproc=nproc, env=env)
    with pytest.raises(TrainerDied) as err:
        proc.start()
    proc.kill()
    msg = str(err.value)
    assert "\n" not in msg
    assert f"trainer rank {rank}: RuntimeError: boom" in msg, msg
    assert "in boom" in msg and "main.py" in msg  # the last frames
    assert BANNER not in msg and str(proc.log_path) in msg
    assert "RuntimeError: boom" in proc.log_path.read_text()  # and in trainer.log


def test_a_rank_that_cannot_load_its_model_names_the_error(tmp_path):
    missing = tmp_path / "no-such-model"
    proc = TrainerProcess(_cfg(missing), missing, tmp_path / "run", nproc=1)
    with pytest.raises(TrainerDied) as err:
        proc.start()
    proc.kill()
    msg = str(err.value)
    assert "trainer rank 0: " in msg and "Error" in msg.split("trainer rank 0: ")[1], msg
    assert BANNER not in msg


def test_records_are_read_earliest_first_and_stale_ones_ignored(tmp_path):
    old = {"who": "trainer rank 3", "time": 10.0, "type": "ValueError", "message": "old"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert failure.recorded_cause(tmp_path, since=20.0) is None
    for who, t, msg in (("trainer rank 1", 31.0, "second"), ("trainer rank 0", 30.0, "first")):
        rec = {"who": who, "time": t, "type": "RuntimeError", "message": msg, "frames": []}
        (tmp_path / f"{who}.json").write_text(json.dumps(rec))
    (tmp_path / "torn.json").write_text('{"who": "x", "ti')
    assert failure.recorded_cause(tmp_path, since=20.0) == (
        f"trainer rank 0: RuntimeError: first (+1 more); unreadable record {tmp_path / 'torn.json'}"
    )


def test_log_cause_takes_the_last_exception_line_and_skips_torch_elastic_noise(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(
        "INFO starting\nTraceback (most recent call last):\n  File 'a.py', line 1\n"
        "torch.OutOfMemoryError: CUDA out of memory\n"
        "error_file: <N/A>\ntraceback : To enable traceback see: https://x\n"
    )
    assert failure.log_cause(log) == "torch.OutOfMemoryError: CUDA out of memory"
    log.write_text("all fine\n")
    assert failure.log_cause(log) is None
    assert failure.log_cause(tmp_path / "missing.log") is None
    assert "no error line in its log" in failure.died("engine", 1, log)


@pytest.mark.parametrize("level", ["rlimit", "bwrap"])
def test_a_sandbox_worker_that_dies_at_boot_says_why(level):
    """Its boot-time stderr (a failing import, bwrap's own complaint) reaches the error."""
    import anyio

    from spade_async.envs import sandbox
    from spade_async.envs.pool import EnvPool, PoolConfig
    from spade_async.envs.process import EnvError, WorkerProcess

    if level == "bwrap" and sandbox.isolation_level("bwrap") != "bwrap":
        pytest.skip("no working bwrap here")
    limits = dict(EnvPool(PoolConfig())._limits)
    del limits["sink_chars"]  # the worker's first read of its limits raises KeyError

    async def boot() -> str:
        w = WorkerProcess(level, limits, 1 << 20)
        try:
            await w.start(timeout=30)
        except EnvError as exc:
            return str(exc)
        finally:
            await w.kill("test over")
        return "started"

    msg = anyio.run(boot)
    assert msg.startswith("boot: worker did not start") and "KeyError: 'sink_chars'" in msg, msg
