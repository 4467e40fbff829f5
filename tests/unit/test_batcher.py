"""Episodes and designer samples -> trainer samples: GRPO per env, fan-out, staleness."""

import pytest

from spade_async.envs.validate import Verdict
from spade_async.loop.batcher import agent_samples, designer_samples, drop_stale
from spade_async.roles.agent import AgentConfig, Episode
from spade_async.roles.designer import DesignSample


def _ep(env: str, reward: float, hinted: bool = False, version: int = 3) -> Episode:
    # prompt [1, 2], turn 1 -> [3, 4], observation [5], turn 2 -> [6]
    return Episode(
        env_id=env,
        seed=0,
        hinted=hinted,
        token_ids=[1, 2, 3, 4, 5, 6],
        loss_mask=[0, 0, 1, 1, 0, 1],
        logprobs=[0, 0, -0.5, -0.25, 0, -1.0],
        turn_spans=[(2, 4), (5, 6)],
        turn_versions=[version, version + 1],
        reward=reward,
        status="terminated",
        turns=2,
        messages=[],
    )


def test_grpo_per_environment_and_hinted_plays_excluded():
    eps = [_ep("a", 1.0), _ep("a", 0.0), _ep("b", 0.5), _ep("b", 0.5), _ep("a", 1.0, hinted=True)]
    samples, zero = agent_samples(eps, AgentConfig())
    assert len(samples) == 4  # zero-advantage samples stay (the reference keeps them)
    assert samples[0].advantage > 0.99 and samples[1].advantage < -0.99  # env a: z-scores +-1
    assert [s.advantage for s in samples[2:]] == [0.0, 0.0]  # env b: equal rewards
    assert zero == 2
    assert all(s.policy_version == 3 for s in samples)  # oldest turn's version
    samples, _ = agent_samples(eps, AgentConfig(train_on_hinted=True))
    assert len(samples) == 5  # the lone hinted play forms its own group: zero advantage
    assert samples[-1].advantage == 0.0


def test_compact_filter_keeps_the_group_and_the_denominator_but_not_the_gradient():
    from spade_async.loop.batcher import agent_batch, loss_normaliser, trim_batch

    eps = [_ep("a", 1.0), _ep("a", 0.0), _ep("a", 0.0), _ep("a", 0.0)]
    eps[1].status = "turn_limit"  # hit max turns: the reference's TRUNCATED
    eps[2].status = "reply_cut"  # a reply without EOS
    off = agent_batch(eps, AgentConfig())
    on = agent_batch(eps, AgentConfig(compact_filter=True))
    # the GRPO group is the same four plays either way: mean 0.25, std sqrt(3) / 4
    z = [(r - 0.25) / (3**0.5 / 4 + 1e-6) for r in (1.0, 0.0, 0.0, 0.0)]
    assert [s.advantage for s in off.samples] == [pytest.approx(v) for v in z]
    assert [None if s is None else s.advantage for s in on.slots] == [
        pytest.approx(z[0]),
        None,
        None,
        pytest.approx(z[3]),
    ]
    assert (on.episodes, on.filtered, len(on.samples)) == (4, 2, 2)
    slots, trimmed = trim_batch(on.slots, 3)  # the trim counts filtered slots like samples
    assert trimmed == 1 and len(slots) == 3 and sum(s is None for s in slots) == 2
    # the sample-mean loss divides by every real sample: 4, not the 2 that train
    assert loss_normaliser(len(on.slots), 0, kl_coef=0.0, entropy_coef=0.0) == 4.0
    # the reference rescales a short batch only without KL/entropy; with KL it divides by 192
    assert loss_normaliser(4, 192, kl_coef=0.0, entropy_coef=0.0) == 4.0
    assert loss_normaliser(4, 192, kl_coef=0.005, entropy_coef=0.0) == 192.0
    assert loss_normaliser(200, 192, kl_coef=0.005, entropy_coef=0.0) == 200.0


def test_thinking_fanout_one_sample_per_turn_with_episode_advantage():
    samples, _ = agent_samples([_ep("a", 1.0), _ep("a", 0.0)], AgentConfig(thinking_fanout=True))
    assert len(samples) == 4
    first, second = samples[0], samples[1]
    assert first.token_ids == [1, 2, 3, 4] and first.loss_mask == [0, 0, 1, 1]
    assert second.token_ids == [1, 2, 3, 4, 5, 6] and second.loss_mask == [0, 0, 0, 0, 0, 1]
    assert first.advantage == second.advantage and (
        first.policy_version,
        second.policy_version,
    ) == (3, 4)


def test_designer_samples_mask_and_scale():
    v = Verdict(valid=True, stage="ok", reason="")
    ds = [
        DesignSample(
            prompt_ids=[1, 2],
            output_ids=[3, 4],
            logprobs=[-0.1, -0.2],
            skill="x",
            doc_id=None,
            version=0,
            verdict=v,
        )
    ] * 3
    out = designer_samples(ds, [0.5, 0.0, -0.2], [True, True, False], scale=4.0)
    # the masked one is dropped; a zero advantage stays (the reference drops masked only)
    assert [s.advantage for s in out] == [2.0, 0.0] and out[0].role == "designer"
    assert out[0].loss_mask == [0, 0, 1, 1] and out[0].rollout_logprobs == [0.0, 0.0, -0.1, -0.2]


def test_drop_stale_respects_max_staleness_and_designer_slack():
    a_old, a_ok = _ep("a", 1.0, version=1), _ep("a", 0.0, version=4)
    samples, _ = agent_samples([a_old, a_ok], AgentConfig())
    kept, dropped = drop_stale(samples, version=5, max_staleness=1)
    assert dropped == 1 and [s.policy_version for s in kept] == [4]
    v = Verdict(valid=True, stage="ok", reason="")
    d = designer_samples(
        [
            DesignSample(
                prompt_ids=[1],
                output_ids=[2],
                logprobs=[-0.1],
                skill="x",
                doc_id=None,
                version=1,
                verdict=v,
            )
        ],
        [1.0],
        [True],
        1.0,
    )
    assert drop_stale(d, version=5, max_staleness=1, designer_slack=4)[1] == 0
    assert drop_stale(d, version=5, max_staleness=1, designer_slack=2)[1] == 1


def test_drop_stale_drops_samples_from_a_lost_newer_policy():
    """After a dead trainer restarts from an older checkpoint, in-flight samples made by the
    lost versions are not trained on."""
    eps = [_ep("a", 1.0, version=3), _ep("a", 0.0, version=5), _ep("a", 1.0, version=2)]
    samples, _ = agent_samples(eps, AgentConfig())
    assert sorted(s.policy_version for s in samples) == [2, 3, 5]
    kept, dropped = drop_stale(samples, version=3, max_staleness=2)
    assert dropped == 1 and sorted(s.policy_version for s in kept) == [2, 3]


def test_trim_batch_keeps_designer_samples_first():
    from spade_async.loop.batcher import trim_batch
    from spade_async.trainer.batch import Sample

    def s(role, i):
        return Sample(
            token_ids=[i, i],
            loss_mask=[0, 1],
            advantage=1.0,
            rollout_logprobs=[0.0, -0.1],
            role=role,
            policy_version=0,
        )

    batch = [s("agent", i) for i in range(5)] + [s("designer", 9), s("designer", 8)]
    kept, dropped = trim_batch(batch, 4)
    assert dropped == 3
    assert [(x.role, x.token_ids[0]) for x in kept] == [
        ("designer", 9),
        ("designer", 8),
        ("agent", 0),
        ("agent", 1),
    ]
    assert trim_batch(batch, 0) == (batch[5:] + batch[:5], 0)  # 0 keeps all
