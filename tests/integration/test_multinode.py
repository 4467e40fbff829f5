"""Two "nodes" on localhost: two torchrun agents (one gloo rank each) meeting at a c10d
rendezvous, trainer.hsdp = true (a 2 x 1 mesh: replicate across the nodes). One train step
equals one process's; a rank lost on the other node is detected within seconds."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time

import msgspec
import pytest
import torch

from spade_async import recipe
from spade_async.engines import free_port
from spade_async.placement import trainer_process
from spade_async.trainer.client import TrainerDied

U = 2.0**-24  # fp32 unit roundoff


def _gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of an n-term fp32 sum."""
    return n * U / (1 - n * U)


def _batch(n: int = 6):
    from spade_async.trainer.batch import Batch, Sample

    return Batch(
        samples=[
            Sample(
                token_ids=[1 + i, 20 + i, 300 + i, 4000 + i, 50 + i],
                loss_mask=[0, 0, 1, 1, 1],
                advantage=1.0 if i % 2 else -1.0,
                rollout_logprobs=[0.0, 0.0, -10.8, -10.8, -10.8],
                role="agent",
            )
            for i in range(n)
        ]
    )


def _cfg(tiny_model, node_rank: int, port: int) -> recipe.Config:
    return recipe.load(
        None,
        [
            f"model='{tiny_model}'",
            "placement.nnodes=2",
            f"placement.node_rank={node_rank}",
            "placement.master_addr='127.0.0.1'",
            f"placement.master_port={port}",
            "placement.cpu_ranks=1",
            "placement.rdzv_id='test'",
            "trainer.hsdp=true",
            "trainer.lr=1e-3",
            "trainer.micro_batch_tokens=12",
            "trainer.start_timeout_s=120",
        ],
    )


@pytest.mark.timeout(300)
def test_two_node_hsdp_step_equals_one_process_and_lost_node_is_detected(tiny_model, tmp_path):
    port = free_port()
    node0 = trainer_process(_cfg(tiny_model, 0, port), tiny_model, tmp_path / "run")
    node1 = trainer_process(_cfg(tiny_model, 1, port), tiny_model, tmp_path / "run")
    assert "--rdzv-backend=c10d" in node0.cmd and "--nnodes=2" in node0.cmd
    assert "--standalone" not in node0.cmd and "--node-rank=1" in node1.cmd
    env = {**os.environ, "OMP_NUM_THREADS": "1", **node1.env}
    with open(tmp_path / "node1.log", "wb") as log:
        agent1 = subprocess.Popen(
            node1.cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        client = node0.start()
        pong = client.ping()
        assert pong.world_size == 2
        m = client.train_step(_batch())
        from spade_async.trainer.step import Trainer

        cfg1 = _cfg(tiny_model, 0, port).trainer
        one = Trainer(msgspec.structs.replace(cfg1, hsdp=False), tiny_model).train_step(_batch())
        # the two computations differ in summation order only: the longest fp32 sum is the
        # softmax over the vocabulary (plus the tokens of the batch) -> gamma_n bounds it
        vocab = 49_152
        tol = _gamma(vocab + int(m["tokens"]))
        assert math.isclose(m["loss"], one["loss"], rel_tol=tol, abs_tol=tol)
        assert math.isclose(m["grad_norm"], one["grad_norm"], rel_tol=tol)
        # a checkpoint of the 2-node HSDP trainer (DCP, resharded on load: below, one rank)
        client.save(str(tmp_path / "ck"), hf_directory=str(tmp_path / "hf2"))
        # the other node's rank dies: this node's rank fails its next collective at once
        other = [p for p in pong.pids if p not in _tree(node0.proc.pid)]
        assert len(other) == 1
        os.kill(other[0], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(TrainerDied):
            for _ in range(200):
                client.train_step(_batch())
                time.sleep(0.05)
        assert time.monotonic() - t0 < 30, "a lost node is noticed within seconds"
    finally:
        node0.kill()
        if agent1.poll() is None:
            os.killpg(agent1.pid, signal.SIGKILL)
        agent1.wait(timeout=30)
    # resumable on a different node count: one process loads the 2-node checkpoint exactly
    from safetensors.torch import load_file

    from spade_async.trainer.launch import TrainerProcess

    single = msgspec.structs.replace(cfg1, hsdp=False)
    with TrainerProcess(single, tiny_model, tmp_path / "run1", load=tmp_path / "ck") as c1:
        assert c1.ping().version == 1
        c1.export_hf(str(tmp_path / "hf1"))
    two = load_file(tmp_path / "hf2" / "model.safetensors")
    one_node = load_file(tmp_path / "hf1" / "model.safetensors")
    assert two.keys() == one_node.keys()
    assert all(torch.equal(two[k], one_node[k]) for k in two)  # bit for bit


def _tree(pid: int) -> set[int]:
    from spade_async.watchdog import descendants

    return {pid, *descendants(pid)}
