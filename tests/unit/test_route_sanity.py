"""Routing replay never routes freely unseen (issue 42): the replayed share, the layout
miss and its warning, -1 / all-zero / duplicate-id rows, short samples, and the replay
weights of each router class (Qwen3-MoE with norm_topk_prob False and True, Mixtral)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest
import torch

from spade_async.generation.routed_experts import RouteShape, decode_sglang, encode_sglang
from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.route_sanity import RouteRuleError, prepare, renormalises

SHAPE = RouteShape(layers=2, topk=2, experts=8)


@pytest.fixture(scope="module", params=[False, True], ids=["norm_topk_prob=False", "True"])
def moe_dir(request, tmp_path_factory):
    from spade_async.models import tiny_moe_dir

    return tiny_moe_dir(tmp_path_factory.mktemp("moe") / "m", norm_topk_prob=request.param)


def _own_routes(model_dir, n=4, dtype=torch.float32):
    """Samples whose routes are the model's own (``dtype``) routes: replaying them must give
    the free forward's log-probs exactly when the replay weights follow the router's rule."""
    from transformers import AutoModelForCausalLM

    from spade_async.generation.route_capture import of

    lm = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    cap = of(lm)
    g = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        ids = torch.randint(10, 3000, (20 + 4 * i,), generator=g)
        with torch.no_grad():
            lm(ids[None])
        rows = cap.take().numpy().astype(np.uint8)
        out.append(
            Sample(
                token_ids=ids.tolist(),
                loss_mask=[0] * 5 + [1] * (len(ids) - 5),
                advantage=1.0,
                rollout_logprobs=[0.0] * len(ids),
                routed_experts=rows[: len(ids) - 1].tobytes(),
            )
        )
    return out


def _trainer(moe_dir, **kw):
    from spade_async.trainer.step import Trainer

    kw.setdefault("micro_batch_tokens", 128)
    return Trainer(TrainerConfig(model=str(moe_dir), lr=0.0, routing_replay=True, **kw), moe_dir)


def _replayed_and_free(replay, causal_lm, samples):
    """The model's log-probs of ``samples`` (one padded row each) with replay and without."""
    out = []
    for s in samples:
        ids = torch.tensor([s.token_ids])
        mb = SimpleNamespace(
            seq_T=torch.zeros_like(ids), position_ids=torch.arange(ids.shape[1])[None]
        )
        replay.prepare([s])
        lps = []
        for on in (True, False):
            if on:
                replay.set_microbatch(mb)
            with torch.no_grad():
                lps.append(torch.log_softmax(causal_lm(ids).logits.float(), -1))
            replay.clear()
        out.append(lps)
    return out


def test_replaying_the_models_own_routes_changes_nothing(moe_dir):
    """Both norm_topk_prob settings: recorded = own routes, so replay must reproduce the
    free forward; with the renormalisation rule flipped it does not (the rule matters)."""
    from transformers import AutoModelForCausalLM

    from spade_async.trainer.routing import Replay

    samples = _own_routes(moe_dir)
    lm = AutoModelForCausalLM.from_pretrained(str(moe_dir), dtype=torch.float32)
    replay = Replay(SHAPE, replay=True, device=torch.device("cpu"))
    replay.attach(lm)
    for on, off in _replayed_and_free(replay, lm, samples):
        torch.testing.assert_close(on, off, rtol=0, atol=1e-5)
    flag = lm.config.norm_topk_prob
    flipped = Replay(SHAPE, replay=True, device=torch.device("cpu"))
    lm2 = AutoModelForCausalLM.from_pretrained(str(moe_dir), dtype=torch.float32)
    for layer in lm2.model.layers:
        layer.mlp.gate.norm_topk_prob = not flag  # the router's own forward flipped too...
    flipped.attach(lm2)
    for layer in lm2.model.layers:
        layer.mlp.gate.norm_topk_prob = flag  # ...then back: the replay keeps the wrong rule
    worst = max((on - off).abs().max() for on, off in _replayed_and_free(flipped, lm2, samples))
    assert worst > 1e-3


def test_mixtral_always_renormalises(tmp_path):
    from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

    from spade_async.trainer.routing import Replay

    cfg = MixtralConfig(vocab_size=3072, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    MixtralForCausalLM(cfg).save_pretrained(tmp_path)
    lm = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    assert renormalises(lm.model.layers[0].mlp.gate) is True
    replay = Replay(SHAPE, replay=True, device=torch.device("cpu"))
    replay.attach(lm)
    for on, off in _replayed_and_free(replay, lm, _own_routes(tmp_path)):
        torch.testing.assert_close(on, off, rtol=0, atol=1e-5)


def test_an_unknown_router_family_is_one_line_at_start():
    class FooTopKRouter(torch.nn.Module):
        norm_topk_prob = True

    with pytest.raises(RouteRuleError) as err:
        renormalises(FooTopKRouter())
    msg = str(err.value)
    assert "\n" not in msg and "FooTopKRouter" in msg and "routing_replay" in msg


def _sample(ids_RLK, n_tokens: int, first_trained: int = 2) -> Sample:
    data = decode_sglang(encode_sglang(ids_RLK), SHAPE, len(ids_RLK))
    return Sample(
        token_ids=list(range(10, 10 + n_tokens)),
        loss_mask=[0] * first_trained + [1] * (n_tokens - first_trained),
        advantage=1.0,
        rollout_logprobs=[0.0] * n_tokens,
        routed_experts=data,
    )


def test_unset_zero_and_duplicate_rows_route_freely_per_row_and_count():
    good = np.array([[1, 2], [3, 4]])
    rows = np.stack([good, good, [[-1, -1], [5, 6]], np.zeros((2, 2)), [[7, 7], [1, 2]], good])
    p = prepare([_sample(rows.astype(np.int32), n_tokens=7)], SHAPE)
    ok = p.ok_RL[:6].tolist()
    assert ok == [[1, 1], [1, 1], [0, 1], [0, 0], [0, 1], [1, 1]]
    assert p.free["unset"] == 1 and p.free["zero"] == 2 and p.free["duplicate"] == 1
    assert p.samples == {"missing": 0, "misfit": 0, "partial": 0}
    # a short sample replays its rows and is counted: rows 0..2 of 7 trained tokens' needs
    short = prepare([_sample(rows[:3].astype(np.int32), n_tokens=7)], SHAPE)
    assert short.samples["partial"] == 1 and short.free["partial"] == (6 - 3) * 2
    assert int(short.rows_N[0]) == 3
    # -1 on the wire is kept (not a misfit); -2 still is one
    with pytest.raises(ValueError, match="expert id -2"):
        decode_sglang(encode_sglang(np.full((1, 2, 2), -2)), SHAPE, 1)


@pytest.fixture(scope="module")
def qwen_true(tmp_path_factory):
    from spade_async.models import tiny_moe_dir

    return tiny_moe_dir(tmp_path_factory.mktemp("moe") / "t", norm_topk_prob=True)


def test_share_is_one_with_replay_and_a_layout_miss_lowers_it_and_warns(qwen_true, caplog):
    """A router that sees one token fewer than the micro-batch (a layout bug, made here by
    dropping the last token from layer 1's router input): that layer routes freely, the
    share falls by exactly its routes, and one warning line names the reason."""
    samples = _own_routes(qwen_true, dtype=torch.bfloat16)
    trainer = _trainer(qwen_true)
    m = trainer.train_step(Batch(samples=samples))
    assert m["route_replayed_share"] == 1.0 and m["route_free_layout"] == 0.0
    gate = trainer.model.causal_lm.model.layers[1].mlp.gate
    forward = gate.forward
    gate.forward = lambda h: forward(h.reshape(-1, h.shape[-1])[:-1])

    def pad_back(_m, _a, out):  # after the replay hook: the block gets T rows again
        return tuple(torch.cat([t, t[-1:]]) for t in out)

    handle = gate.register_forward_hook(pad_back)
    with caplog.at_level(logging.WARNING, logger="spade_async.trainer.routing"):
        m = trainer.train_step(Batch(samples=samples))
    needed = sum(len(s.token_ids) - 1 for s in samples) * 2  # positions 0..last-1, 2 layers
    assert m["route_free_layout"] == needed / 2
    assert m["route_replayed_share"] == pytest.approx(0.5, abs=1e-12)
    lines = [r.getMessage() for r in caplog.records if "replayed this step" in r.getMessage()]
    assert len(lines) == 1 and "layout" in lines[0] and "\n" not in lines[0]
    gate.forward = forward
    handle.remove()
    m = trainer.train_step(Batch(samples=samples))
    assert m["route_replayed_share"] == 1.0


def test_bad_rows_train_with_replay_elsewhere(qwen_true):
    """A -1 row no longer drops the sample: its other rows replay, the share says what not."""
    samples = _own_routes(qwen_true, dtype=torch.bfloat16)
    rows = np.frombuffer(samples[0].routed_experts, np.uint8).reshape(-1, 2, 2).astype(np.int32)
    rows[3, 0] = -1
    data = decode_sglang(encode_sglang(rows), SHAPE, len(rows))
    samples[0] = msgspec.structs.replace(samples[0], routed_experts=data)
    m = _trainer(qwen_true).train_step(Batch(samples=samples))
    needed = sum(len(s.token_ids) - 1 for s in samples) * 2
    assert m["route_free_unset"] == 1.0 and m["route_samples_bad"] == 0.0
    assert m["route_replayed_share"] == pytest.approx((needed - 1) / needed, abs=1e-12)
    assert m["route_mismatch"] == 0.0
