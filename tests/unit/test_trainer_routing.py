"""Routing replay's trainer side on a tiny random Qwen3-MoE (grouped experts: the trainer's
MoE load path): a bf16 "engine" (the model in bf16, routes taken by route_capture's hooks)
routes some tokens differently from the fp32 trainer; with replay the trainer's forward
uses the engine's experts on every token (route_mismatch 0 on every micro-batch) and the
log-prob mismatch falls; packing, padding, the recompute head, LoRA and the KL reference
all replay; a sequence-parallel slice gets its own tokens' rows; samples without routes
train without replay and are counted."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import LoraConfig, TrainerConfig


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from spade_async.models import tiny_moe_dir

    return tiny_moe_dir(tmp_path_factory.mktemp("moe") / "model")


@pytest.fixture(scope="module")
def samples(moe_dir):
    """12 samples whose routes and log-probs come from the model run in bf16."""
    from transformers import AutoModelForCausalLM

    from spade_async.generation.route_capture import of

    lm = AutoModelForCausalLM.from_pretrained(str(moe_dir), dtype=torch.bfloat16)
    cap = of(lm)
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(12):
        ids = torch.randint(10, 3000, (30 + 3 * i,), generator=g)
        with torch.no_grad():
            logits = lm(ids[None]).logits[0].float()
        routes = cap.take().numpy().astype(np.uint8)  # [T, L, K]
        lp = torch.log_softmax(logits[:-1], -1).gather(1, ids[1:, None])[:, 0]
        n = len(ids)
        out.append(
            Sample(
                token_ids=ids.tolist(),
                loss_mask=[0] * 8 + [1] * (n - 8),
                advantage=1.0 if i % 2 else -0.5,
                rollout_logprobs=[0.0] + lp.tolist(),
                routed_experts=routes[: n - 1].tobytes(),  # SGLang's rows: seqlen - 1
            )
        )
    return out


def _trainer(moe_dir, **kw):
    from spade_async.trainer.step import Trainer

    kw.setdefault("micro_batch_tokens", 160)
    kw.setdefault("routing_replay", True)
    return Trainer(TrainerConfig(model=str(moe_dir), lr=0.0, **kw), moe_dir)


def _step(trainer, samples, replay: bool, **kw):
    trainer.routing.replay = replay
    m = trainer.train_step(Batch(samples=samples), **kw)
    return m, [float(x) for x in trainer.routing.per_micro]


@pytest.fixture(scope="module")
def replayed(moe_dir, samples):
    """One trainer's step with replay and then without (lr 0: the same weights)."""
    trainer = _trainer(moe_dir)
    on = _step(trainer, samples, True)
    return on, _step(trainer, samples, False)[0]


def test_replay_uses_the_engines_routes_and_lowers_the_mismatch(replayed):
    (on, per_micro), off = replayed
    assert on["micro_batches"] >= 3 and len(per_micro) == on["micro_batches"]
    assert on["route_mismatch"] == 0.0 and max(per_micro) == 0.0
    assert off["route_mismatch"] > 0 and off["route_mismatch"] == off["route_drift"]
    assert on["route_drift"] > 0  # its own router (on replayed inputs) still disagrees
    assert on["mismatch_kl"] < off["mismatch_kl"]
    assert on["route_samples_missing"] == 0 and on["route_replay"] == 1.0
    assert on["route_replayed_share"] == 1.0 and off["route_replayed_share"] == 0.0


@pytest.mark.parametrize(("layout", "head"), [("padded", "fused"), ("packed", "recompute")])
def test_replay_does_not_depend_on_layout_or_head(moe_dir, samples, replayed, layout, head):
    (ref, _), _ = replayed
    got, per_micro = _step(_trainer(moe_dir, head=head), samples, True, layout=layout)
    assert max(per_micro) == 0.0
    assert got["mismatch_kl"] == pytest.approx(ref["mismatch_kl"], rel=1e-4, abs=1e-9)


def test_lora_and_the_kl_reference_route_freely_by_default(moe_dir, samples):
    """Adapters on the attention projections; the KL reference (the base, adapters off, and
    a frozen copy) routes with its own router (slime's FALLTHROUGH ref pass): its log-probs
    are the free forward's, not the replayed policy's, and the step-0 KL is not 0."""
    from spade_async.trainer.packing import build_microbatch
    from spade_async.trainer.step import _logprobs

    mb = build_microbatch(samples, list(range(len(samples))), packed=True)
    lora = _trainer(moe_dir, lora=LoraConfig(rank=4, target_modules=("q_proj", "v_proj")),
                    kl_coef=0.1)  # fmt: skip
    full = _trainer(moe_dir, kl_coef=0.1)
    assert full.ref_model is not None and full.cfg.kl_reference_routes == "free"
    for trainer in (lora, full):
        m, per_micro = _step(trainer, samples, True)
        assert max(per_micro) == 0.0 and m["route_drift"] > 0 and m["kl"] > 0
        trainer.routing.prepare(samples)
        trainer.routing.set_microbatch(mb)
        with torch.no_grad():
            ref_T, policy_T = trainer._ref_logprobs(mb), _logprobs(trainer.model, mb)
        trainer.routing.clear()
        with torch.no_grad():
            free_T = _logprobs(trainer.model, mb)
        assert torch.equal(ref_T, free_T) and (ref_T - policy_T).abs().max() > 0


def test_the_kl_reference_replays_when_asked(moe_dir, samples):
    """``kl_reference_routes = "replay"``: the reference takes the engine's routes too; with
    identical weights its KL is 0 and its log-probs are the replayed policy's."""
    lora = _trainer(moe_dir, lora=LoraConfig(rank=4, target_modules=("q_proj", "v_proj")),
                    kl_coef=0.1, kl_reference_routes="replay")  # fmt: skip
    few = samples[:4]
    m, per_micro = _step(lora, few, True)
    assert max(per_micro) == 0.0 and m["kl"] == pytest.approx(0.0, abs=1e-6)
    full = _trainer(moe_dir, kl_coef=0.1, kl_reference_routes="replay")
    m, _ = _step(full, few, True)
    assert m["kl"] == pytest.approx(0.0, abs=1e-6)
    from spade_async.trainer.packing import build_microbatch
    from spade_async.trainer.step import _logprobs

    mb = build_microbatch(samples, list(range(len(samples))), packed=True)
    full.routing.prepare(samples)
    full.routing.set_microbatch(mb)
    with torch.no_grad():
        ref_T, policy_T = full._ref_logprobs(mb), _logprobs(full.model, mb)
    full.routing.clear()
    with torch.no_grad():
        free_T = full._ref_logprobs(mb)
    assert torch.equal(ref_T, policy_T)
    assert (free_T - ref_T).abs().max() > 0


def test_samples_without_routes_train_without_replay_and_count(moe_dir, samples):
    trainer = _trainer(moe_dir)
    mixed = list(samples)
    mixed[0] = msgspec.structs.replace(mixed[0], routed_experts=b"")
    mixed[1] = msgspec.structs.replace(mixed[1], routed_experts=mixed[1].routed_experts[:-1])
    m, per_micro = _step(trainer, mixed, True)
    assert m["route_samples_missing"] == 1 and m["route_samples_bad"] == 1
    assert max(per_micro) == 0.0
    # both samples' needed token x layer routes are counted, and the share says so
    need = sum(max(i for i, v in enumerate(s.loss_mask) if v) for s in mixed[:2]) * 2
    assert m["route_free_missing"] + m["route_free_misfit"] == need
    assert m["route_replayed_share"] < 1.0
    bare = [msgspec.structs.replace(s, routed_experts=b"") for s in samples]
    m, _ = _step(trainer, bare, True)
    assert m["route_samples_missing"] == len(samples) and m["route_mismatch"] == 0.0


def test_a_sequence_parallel_slice_gets_its_tokens_routes(moe_dir, samples):
    from spade_async.generation.routed_experts import RouteShape
    from spade_async.trainer.packing import build_microbatch
    from spade_async.trainer.routing import Replay
    from spade_async.trainer.sequence_parallel import shard

    replay = Replay(RouteShape(layers=2, topk=2, experts=8), replay=True, device="cpu")
    batch = samples[:3]
    replay.prepare(batch)
    mb = build_microbatch(batch, [0, 1, 2], packed=True)
    for rank in range(2):
        part = shard(mb, rank, 2)
        replay.set_microbatch(part)
        seq, pos = part.seq_T.reshape(-1), part.position_ids.reshape(-1)
        for t in range(len(seq)):
            s, p = int(seq[t]), int(pos[t])
            rows = len(batch[s].routed_experts) // 4 if s >= 0 else 0
            assert bool(replay.ok_TL[t].all()) == (s >= 0 and p < rows)
            if replay.ok_TL[t].all():
                want = np.frombuffer(batch[s].routed_experts, np.uint8).reshape(-1, 2, 2)[p]
                assert replay.ids_TLK[t].tolist() == want.tolist()


def test_a_checkpoint_reforward_replays_the_same_routes(moe_dir, samples):
    """Activation checkpointing re-runs each block's forward in backward: the same rows,
    the same gradients, and the routes are counted once."""
    batch = samples[:6]
    plain, ckpt = _trainer(moe_dir), _trainer(moe_dir, activation_checkpointing="full")
    a, _ = _step(plain, batch, True)
    b, per_micro = _step(ckpt, batch, True)
    assert max(per_micro) == 0.0 and b["route_drift"] == a["route_drift"]
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert float(plain.routing.total) == float(ckpt.routing.total) > 0


def test_measure_mode_captures_without_replaying(moe_dir, samples):
    """``routing_replay = "measure"``: routes requested and compared, experts not replaced."""
    from spade_async import recipe

    cfg = recipe.load(None, [f"model='{moe_dir}'", "trainer.routing_replay='measure'"])
    assert cfg.trainer.routing_replay == "measure"
    trainer = _trainer(moe_dir, routing_replay="measure")
    assert trainer.routing.replay is False
    m = trainer.train_step(Batch(samples=samples[:4]))
    assert m["route_replay"] == 0.0 and m["route_mismatch"] == m["route_drift"]
