"""One designer round with a scripted engine: code extracted, gated in the sandbox, saved to
envs/, recorded in memory with its skill (a regression test: numpy strings once broke it)."""

from pathlib import Path
from types import SimpleNamespace

import anyio
import numpy as np

from spade_async import recipe
from spade_async.envs.pool import EnvPool
from spade_async.generation.client import GenerateResult
from spade_async.loop import cycle
from spade_async.memory.store import MemoryStore
from spade_async.memory.writer import MemoryWriter
from spade_async.rundir import RunDir
from spade_async.telemetry.metrics import Meters

ENV = (Path(__file__).parents[1] / "integration" / "envs" / "lower_share.py").read_text()
ENV2 = (Path(__file__).parents[1] / "integration" / "envs" / "first_letter.py").read_text()


def _result(text, n_ids=2):
    return GenerateResult(
        output_ids=[1] * n_ids,
        logprobs=[-0.1] * n_ids,
        finish_reason="stop",
        matched=None,
        text=text,
        weight_version="0",
        prompt_tokens=1,
        url="scripted",
    )


class ScriptedClient:
    def __init__(self, replies, retries=()):
        self.replies = replies
        self.retries = list(retries)  # fresh single samples, in order
        self.retry_calls = 0

    async def generate(self, input_ids, sampling, **kw):
        self.retry_calls += 1
        return _result(self.retries.pop(0), n_ids=5)

    async def generate_n(self, input_ids, sampling, **kw):
        return [
            GenerateResult(
                output_ids=[1, 2],
                logprobs=[-0.1, -0.2],
                finish_reason="stop",
                matched=None,
                text=r,
                weight_version="3",  # the designer records the engine's version
                prompt_tokens=len(input_ids),
                url="scripted",
            )
            for r in self.replies[: sampling.n]
        ]


def test_designer_round_records_valid_and_broken_designs(tmp_path, tokenizer_path):
    from transformers import AutoTokenizer

    cfg = recipe.load(
        None,
        [
            "designer.skills_per_regen=1",
            "designer.prompts_per_skill=1",
            "designer.samples_per_prompt=2",
            "designer.use_corpus=false",
            "designer.retries=3",
            "envs.prewarm=0",
        ],
    )
    client = ScriptedClient(
        [f"Here:\n```python\n{ENV}```", "no code here"],
        retries=["still no code", f"```python\n{ENV2}```", "never asked"],
    )
    run_dir = RunDir(tmp_path / "run").create()
    logged = []
    rt_counts = {}

    async def main():
        with MemoryStore(run_dir.memory, cfg.memory) as store:
            writer = MemoryWriter(store)
            async with anyio.create_task_group() as tg, EnvPool(cfg.envs) as pool:
                await tg.start(writer.run)
                rt = SimpleNamespace(
                    cfg=cfg,
                    rng=np.random.default_rng(0),
                    corpus=None,
                    store=store,
                    writer=writer,
                    pool=pool,
                    client=client,
                    tokenizer=AutoTokenizer.from_pretrained(tokenizer_path),
                    run_dir=run_dir,
                    meters=Meters(),
                    tel=SimpleNamespace(log=lambda *a, **k: logged.append(a)),
                    state=SimpleNamespace(step=0),
                )
                samples = await cycle.regenerate(rt, version=3)
                writer.close()
                rt_counts.update(rt.meters.snapshot())
            return samples, list(store.records())

    samples, records = anyio.run(main)
    ok, broken = samples
    assert ok.verdict.valid and ok.env_id and broken.verdict.stage == "syntax"
    assert isinstance(ok.skill, str) and ok.skill in cfg.designer.skills
    # the broken first attempt was retried twice (counted, untrained) until one was valid:
    # its environment enters the pool, the sample keeps its first attempt's tokens and verdict
    assert client.retry_calls == 2 and broken.retries == 2 and ok.retries == 0
    assert broken.env_id and broken.env_id != ok.env_id and broken.extra_tokens == 10
    assert broken.output_ids == [1, 2] and not broken.verdict.valid
    assert {r.skill for r in records} == {ok.skill} and len(records) == 2
    assert records[0].origin.policy_version == 3
    assert (run_dir.envs / f"{ok.env_id}.py").read_text() == ENV
    assert len(logged) == 2  # one latest-environments record per design
    assert rt_counts["designer/retries"] == 2 and rt_counts["designer/filled_by_retry"] == 1


def test_skills_rotate_round_robin_per_regeneration():
    skills = ("a", "b", "c", "d", "e", "f")
    assert [cycle.active_skills(skills, e, 3) for e in range(3)] == [
        ["a", "b", "c"],
        ["d", "e", "f"],
        ["a", "b", "c"],
    ]
    assert cycle.active_skills(skills, 1, 4) == ["e", "f", "a", "b"]
    assert cycle.active_skills(skills, 7, 6) == list(skills)
