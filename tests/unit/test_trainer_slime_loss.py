"""Trainer.accumulate against slime's loss (tests/slime_reference.py), in float64.

The batch is built as a thinking run builds it (``loop/batcher.agent_batch`` with
``thinking_fanout``, then the step's unit count): an episode of three turn samples, an
episode of one turn (one sample), and a compact-filtered episode (a zero-mask unit the
batch does not carry), all three in one GRPO group. slime sees one group per episode
(``group_mask_sums``), a global batch of 3, and in per-token mode max(n, 1) loss tokens
per sample (the absent one adds 1). The KL target is the rollout log-probs, placed at
``logprob + d`` with d from -20 to +10 (on both sides of both clamp edges; rollout
log-probs must stay <= 0 and the model's are near log(1/V) = -10.8).

The tiny model runs in float64 on both sides: our packed micro-batch through either head,
and slime's formula over a per-sample forward of the same weights; the loss, the gradient
w.r.t. the hidden state and w.r.t. the (tied) LM-head weight agree within 1e-12 relative
(float64 rounding, ~1e-16 per operation, through V = 49,152-term sums: < 1e-13).
"""

from __future__ import annotations

import msgspec
import pytest
import slime_reference as slime
import torch
from numerics import assert_close_norm

from spade_async.trainer.batch import Batch
from spade_async.trainer.config import TrainerConfig

REL, TEMP = 1e-12, 0.7
# episode A: prompt 3, three turns with observations between (spans [3,7), [9,12), [14,18))
SPANS_A = [(3, 7), (9, 12), (14, 18)]
SPANS_B = [(4, 12)]
# d = rollout - logprob = ref - logprob: both sides of k3 = 10 (d = 2.6109, -10.99998)
POOL = [2.60, 2.62, -10.99, -11.01, -20.0, 9.0, *torch.linspace(-20.0, 9.0, 14).tolist()]
MODES = {
    "token": "per_token",
    "seq-mean-token-mean": "sample_mean",
    "seq-mean-token-sum": "seq_sum",
}


def _f32(x: float) -> float:
    """The value the micro-batch carries (packing.py: advantages, rollout log-probs fp32)."""
    return torch.tensor(x, dtype=torch.float32).item()


def _episodes(vocab: int, lp_of):
    """Three episodes of one environment; ``lp_of(ids)`` gives the model's log-probs of
    ids[1:], so the rollout log-probs can sit at a chosen distance d from them."""
    from spade_async.roles.agent import Episode

    g = torch.Generator().manual_seed(5)
    out = []
    for i, (n, spans, reward, status) in enumerate(
        [(18, SPANS_A, 1.0, "terminated"), (12, SPANS_B, 0.0, "terminated"),
         (10, [(3, 10)], 0.2, "truncated")]
    ):  # fmt: skip
        ids = torch.randint(1, vocab, (n,), generator=g).tolist()
        mask = [0] * n
        for s, e in spans:
            mask[s:e] = [1] * (e - s)
        lp = [0.0] + lp_of(ids)
        it = iter(POOL[(7 * i + j) % len(POOL)] for j in range(sum(mask)))
        logprobs = [_f32(lp[t] + next(it)) if mask[t] else 0.0 for t in range(n)]
        out.append(
            Episode(env_id="e", seed=i, hinted=False, token_ids=ids, loss_mask=mask,
                    logprobs=logprobs, turn_spans=spans, turn_versions=[0] * len(spans),
                    reward=reward, status=status, turns=len(spans), messages=[])
        )  # fmt: skip
    return out


def _step_batch(trainer, fanout: bool = True):
    from spade_async.loop.batcher import agent_batch, loss_normaliser, loss_units
    from spade_async.roles.agent import AgentConfig

    model = trainer.model.causal_lm

    def lp_of(ids):
        with torch.no_grad():
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            lp, _ = slime.head_logprobs(
                h[:-1], model.get_output_embeddings().weight, torch.tensor(ids[1:]), TEMP
            )
        return lp.tolist()

    cfg = AgentConfig(thinking_fanout=fanout, compact_filter=True)
    b = agent_batch(_episodes(trainer.vocab_size, lp_of), cfg)
    groups = [0, 0, 0, 1, None] if fanout else [-1, -1, None]
    assert [s.loss_group if s else None for s in b.slots] == groups
    n = loss_normaliser(loss_units(b.slots), 0, kl_coef=0.0, entropy_coef=0.0)
    assert n == 3.0  # three episodes, not five samples
    return Batch(samples=b.samples, loss_normaliser=n)


def _slime_reference(trainer, batch, o):
    """slime's loss over a per-sample float64 forward; grads of each sample's hidden
    state (retained) and of every parameter."""
    model = trainer.model.causal_lm
    weight = model.get_output_embeddings().weight
    hidden, lps, ents, masks, advs, rolls = [], [], [], [], [], []
    for s in batch.samples:
        h = model.model(input_ids=torch.tensor([s.token_ids])).last_hidden_state[0]
        h.retain_grad()
        hidden.append(h)
        lp, ent = slime.head_logprobs(h[:-1], weight, torch.tensor(s.token_ids[1:]), TEMP)
        lps.append(lp)
        ents.append(ent)
        masks.append(torch.tensor(s.loss_mask[1:], dtype=torch.float64))
        advs.append(torch.full_like(lp, _f32(s.advantage)))
        rolls.append(torch.tensor(s.rollout_logprobs[1:], dtype=torch.float64))
    # slime's group ids: an episode's turn samples share one; any other sample its own
    groups = [s.loss_group if s.loss_group >= 0 else -1 - i for i, s in enumerate(batch.samples)]
    loss = slime.slime_loss(
        lps, masks, advs, groups=groups,
        mode=MODES[o["loss_agg"]], units=3,
        absent_zero_mask_samples=1, rollout_log_probs=rolls,
        use_rollout_logprobs=o["old_logprobs"] == "rollout", use_tis=o["tis_cap"] > 0,
        tis_clip=o["tis_cap"], ref_log_probs=rolls, kl_loss_coef=o["kl_coef"], entropy=ents,
        entropy_coef=o["entropy_coef"], eps_clip=0.2, eps_clip_high=0.28,
    )  # fmt: skip
    loss.backward()
    return loss.detach(), [h.grad[:-1] for h in hidden], weight.grad.clone()


def _capture(trainer):
    """The packed row's hidden state (gradient retained) and position ids, per forward."""
    seen = []

    def hook(module, args, kwargs, out):
        out.last_hidden_state.retain_grad()
        seen.append((kwargs["input_ids"][0], kwargs["position_ids"][0], out.last_hidden_state))

    return seen, trainer.model.causal_lm.model.register_forward_hook(hook, with_kwargs=True)


def _recording(loss_fn, losses: list):
    """Trainer._loss that also keeps each micro-batch's loss from the head, in the model's
    float64 (accumulate's result vector sums it in float32)."""

    def loss(*args, **kwargs):
        out = loss_fn(*args, **kwargs)
        losses.append(out[0])
        return out

    return loss


def _per_sample(seen, batch):
    """Each sample's rows of the packed hidden-state gradient (minus its last position)."""
    assert len(seen) == 1  # one packed micro-batch
    ids, pos, h = seen[0]
    starts = (pos == 0).nonzero().flatten().tolist() + [len(pos)]
    rows = {}
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        rows[tuple(ids[a:b].tolist())] = h.grad[0, a : b - 1]
    return [rows[tuple(s.token_ids)] for s in batch.samples]


OPTIONS = {
    "kl_tis_entropy": dict(kl_coef=0.5, tis_cap=2.0, entropy_coef=0.03),
    "plain": dict(kl_coef=0.0, tis_cap=0.0, entropy_coef=0.0),
    "rollout_old_kl_tis": dict(kl_coef=0.5, tis_cap=2.0, entropy_coef=0.0,
                               old_logprobs="rollout"),
}  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize("head", ["fused", "recompute"])
def test_accumulate_equals_slime_in_float64(tiny_model, head):
    from spade_async.trainer.step import Trainer

    base = TrainerConfig(model=str(tiny_model), head=head, temperature=TEMP, kl_reference="rollout")
    trainer = Trainer(base, tiny_model)
    trainer.model.double()
    weight = trainer.model.causal_lm.get_output_embeddings().weight
    batch = _step_batch(trainer)
    loss_fn = trainer._loss
    for agg in ("token", "seq-mean-token-mean", "seq-mean-token-sum"):
        for name, opt in OPTIONS.items():
            o = {"old_logprobs": "detached", **opt, "loss_agg": agg}
            trainer.cfg = msgspec.structs.replace(base, **o)
            trainer.model.zero_grad(set_to_none=True)
            seen, handle = _capture(trainer)
            losses: list[torch.Tensor] = []
            trainer._loss = _recording(loss_fn, losses)
            try:
                trainer.accumulate(batch)
            finally:
                handle.remove()
                del trainer._loss
            got_h, got_w = _per_sample(seen, batch), weight.grad.clone()
            trainer.model.zero_grad(set_to_none=True)
            want, want_h, want_w = _slime_reference(trainer, batch, o)
            trainer.model.zero_grad(set_to_none=True)
            case = f"{head}, {agg}, {name}"
            (got,) = losses
            assert got.dtype == torch.float64
            assert abs(got.item() - want.item()) <= REL * abs(want.item()), case
            assert_close_norm(torch.cat(got_h), torch.cat(want_h), REL, f"{case}: hidden")
            assert_close_norm(got_w, want_w, REL, f"{case}: LM-head weight")


def test_three_turn_samples_train_as_their_episode_in_one_sample(tiny_model):
    """seq-mean-token-mean: an episode fanned out into three turn samples (one loss_group)
    gives the loss and the gradient of the same episode trained as one sample (its turns see
    the same prefixes; slime takes one mean per group and counts the group once). Before,
    each turn sample was a mean of its own and the batch counted five units.

    Loss and hidden-state gradient (each position's copies summed) agree within 1e-12. The
    parameter gradients agree to float32 rounding only: transformers' LlamaRMSNorm computes
    in float32 whatever the model's dtype, and its backward rounds a position's gradient
    once in one sample but per copy in three (~1e-8 relative below the last decoder
    layer's norm, the same in a plain HF forward; a 1e-6 bound)."""
    from spade_async.trainer.batch import loss_units
    from spade_async.trainer.step import Trainer

    cfg = TrainerConfig(model=str(tiny_model), temperature=TEMP, kl_reference="rollout",
                        kl_coef=0.5, loss_agg="seq-mean-token-mean")  # fmt: skip
    trainer = Trainer(cfg, tiny_model)
    trainer.model.double()
    loss_fn, out = trainer._loss, []
    for fanout in (True, False):
        batch = _step_batch(trainer, fanout)
        losses: list[torch.Tensor] = []
        trainer._loss = _recording(loss_fn, losses)
        trainer.model.zero_grad(set_to_none=True)
        seen, handle = _capture(trainer)
        try:
            trainer.accumulate(batch)
        finally:
            handle.remove()
            del trainer._loss
        # each position's gradient, summed over an episode's turn samples (its prefixes)
        units, rows = loss_units(batch.samples), _per_sample(seen, batch)
        size: dict[int, int] = {}
        for u, g in zip(units, rows, strict=True):
            size[u] = max(size.get(u, 0), len(g))
        episodes = {u: rows[0].new_zeros(n, rows[0].shape[1]) for u, n in size.items()}
        for u, g in zip(units, rows, strict=True):
            episodes[u][: len(g)] += g
        grads = torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()])
        out.append((sum(losses), torch.cat(list(episodes.values())), grads))
    (fan_loss, fan_h, fan_g), (one_loss, one_h, one_g) = out
    assert fan_h.shape == one_h.shape == (17 + 11, trainer.model.causal_lm.config.hidden_size)
    assert abs(fan_loss.item() - one_loss.item()) <= REL * abs(one_loss.item())
    assert_close_norm(fan_h, one_h, REL, "fan-out vs one sample: hidden-state gradient")
    assert_close_norm(fan_g, one_g, 1e-6, "fan-out vs one sample: parameter gradients")
