"""Routing replay under Ulysses sequence parallelism: two gloo ranks sharing one packed row of
a tiny Qwen3-MoE, each replaying the routes of its own slice of tokens, give the one-rank
replayed loss and gradients; the routes (a bf16 pass's) differ from the fp32 trainer's own
on some tokens, so a slice handed another slice's rows would not."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig


def _batch(model: str) -> Batch:
    from transformers import AutoModelForCausalLM

    from spade_async.generation.route_capture import of

    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
    cap, g, samples = of(lm), torch.Generator().manual_seed(3), []
    for i, n in enumerate((37, 23, 51)):  # odd total: the row is padded to a multiple of 2
        ids = torch.randint(10, 3000, (n,), generator=g)
        with torch.no_grad():
            lm(ids[None])
        routes = cap.take().numpy().astype("uint8")[: n - 1].tobytes()
        mask = [0] * 5 + [1] * (n - 5)
        samples.append(Sample(token_ids=ids.tolist(), loss_mask=mask, advantage=(-1.0) ** i,
                              rollout_logprobs=[-5.0 * m for m in mask],
                              routed_experts=routes))  # fmt: skip
    return Batch(samples=samples)


def _cfg(model, sp: int) -> TrainerConfig:
    return TrainerConfig(model=str(model), sequence_parallel=sp, routing_replay=True,
                         micro_batch_tokens=64 if sp > 1 else 128, grad_clip=0.0)  # fmt: skip


def _grads(trainer) -> torch.Tensor:
    out = []
    for _, p in sorted(trainer.model.named_parameters()):
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out.append((g if g is not None else torch.zeros(p.shape)).detach().double().flatten())
    return torch.cat(out)


def _rank(rank: int, model: str, init: str, out: str, batch: Batch) -> None:
    from spade_async.trainer.step import Trainer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        trainer = Trainer(_cfg(model, 2), model)
        vec, keys, n_micro = trainer.accumulate(batch)
        dist.all_reduce(vec)
        grads = _grads(trainer)
        if rank == 0:
            torch.save({"vec": vec, "keys": keys, "grads": grads, "micro": n_micro}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned gloo ranks + two in-process runs, ~40 s
@pytest.mark.timeout(300)
def test_sp2_replays_each_slices_routes(tmp_path):
    from spade_async.models import tiny_moe_dir
    from spade_async.trainer.step import Trainer

    model = str(tiny_moe_dir(tmp_path / "moe"))
    batch = _batch(model)
    out, init = str(tmp_path / "sp.pt"), f"file://{tempfile.mktemp(dir=tmp_path)}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank, args=(model, init, out, batch), nprocs=2, join=True)
    sp = torch.load(out, weights_only=True)
    assert sp["micro"] == 1  # one row, split over the two ranks
    one = Trainer(_cfg(model, 1), model)
    vec, keys, _ = one.accumulate(batch)
    ref = _grads(one)
    assert (sp["grads"] - ref).norm() <= 1e-4 * ref.norm()
    assert abs(float(sp["vec"][0]) - float(vec[0])) <= 1e-4 * max(1.0, abs(float(vec[0])))
    drift = dict(zip(sp["keys"], sp["vec"][1:].tolist(), strict=False))
    assert drift["route_mismatched_n"] == 0 and drift["route_routed_n"] > 0
    free = Trainer(_cfg(model, 1), model)
    free.routing.replay = False
    free.accumulate(batch)
    assert (_grads(free) - ref).norm() > 1e-4 * ref.norm(), "replay changed nothing here"
