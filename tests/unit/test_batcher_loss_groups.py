"""An episode whose turns become several samples (thinking fan-out) is one unit of the loss.

The reference gives every turn sample of an episode one group id
(``spare/slime/trajectory_converter.py`` ``fan_out_thinking_sample``; ``spare_rollout.py``
sets ``s.group_id = gi``), and slime's sample mean divides each sample's token sum by the
group's mask sum (``slime/backends/megatron_utils/cp_utils.py`` ``get_sum_of_sample_mean``
with ``group_mask_sums``), then the step by its global batch, which counts groups. So one
token mean per episode, divided by the number of episodes.
"""

from __future__ import annotations

import pytest

from spade_async.loop.batcher import agent_batch, loss_normaliser, loss_units
from spade_async.roles.agent import AgentConfig, Episode
from spade_async.trainer.batch import Batch, BatchError, Sample, validate_batch
from spade_async.trainer.packing import loss_denominator, unit_tokens


def _ep(spans, reward, status="terminated") -> Episode:
    n = spans[-1][1]
    mask = [0] * n
    for s, e in spans:
        mask[s:e] = [1] * (e - s)
    return Episode(env_id="e", seed=0, hinted=False, token_ids=list(range(1, n + 1)),
                   loss_mask=mask, logprobs=[-0.5 * m for m in mask], turn_spans=spans,
                   turn_versions=[0] * len(spans), reward=reward, status=status,
                   turns=len(spans), messages=[])  # fmt: skip


THREE_TURNS = [(2, 5), (6, 8), (9, 13)]  # 3 + 2 + 4 = 9 loss tokens
ONE_TURN = [(3, 9)]  # 6 loss tokens


def test_an_episode_of_three_turn_samples_is_one_unit_like_an_episode_of_one():
    eps = [_ep(THREE_TURNS, 1.0), _ep(ONE_TURN, 0.0), _ep(THREE_TURNS, 0.5, "turn_limit")]
    b = agent_batch(eps, AgentConfig(thinking_fanout=True, compact_filter=True))
    # three turn samples of episode 0 share its group; the compact-filtered episode is one
    # empty unit however many turns it had (before: a None slot per turn)
    assert [None if s is None else s.loss_group for s in b.slots] == [0, 0, 0, 1, None]
    assert [sum(s.loss_mask) for s in b.samples] == [3, 2, 4, 6]
    assert loss_units(b.slots) == 3  # episodes, not 5 samples (or 7 slots)
    n = loss_normaliser(loss_units(b.slots), 0, kl_coef=0.0, entropy_coef=0.0)
    assert n == 3.0
    # the trainer's per-sample n_s: the episode's 9 loss tokens, not each turn's own
    assert unit_tokens(b.samples) == [9, 9, 9, 6]
    assert loss_denominator(b.samples, "seq-mean-token-mean") == 2.0  # units present
    assert loss_denominator(b.samples, "seq-mean-token-mean", n) == 3.0
    # token mode: slime's num_tokens = sum max(n_i, 1): 15 loss tokens + the empty unit's 1
    assert loss_denominator(b.samples, "token", n) == 16.0
    assert loss_denominator(b.samples, "token") == 15.0
    validate_batch(Batch(samples=b.samples, loss_normaliser=n), vocab_size=100)
    # without fan-out each episode is one sample of its own unit
    one = agent_batch(eps, AgentConfig(compact_filter=True))
    assert [None if s is None else s.loss_group for s in one.slots] == [-1, -1, None]
    assert loss_units(one.slots) == 3 and unit_tokens(one.samples) == [9, 6]


def test_loss_groups_count_once_in_the_batch_check():
    s = Sample(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], advantage=1.0,
               rollout_logprobs=[0.0, -1.0, -1.0], loss_group=4)  # fmt: skip
    batch = Batch(samples=[s, s, s], loss_normaliser=1.0)  # one episode, three turns
    validate_batch(batch, vocab_size=10)
    with pytest.raises(BatchError, match="below the batch's 1 samples"):
        validate_batch(Batch(samples=[s, s], loss_normaliser=0.5), vocab_size=10)
