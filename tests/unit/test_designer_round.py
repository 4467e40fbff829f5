"""One designer round with a scripted engine: code extracted, gated in the sandbox, saved to
envs/, recorded in memory with its skill (a regression test: numpy strings once broke it)."""

from pathlib import Path
from types import SimpleNamespace

import anyio
import numpy as np

from spade_async import cycle, recipe
from spade_async.envs.pool import EnvPool
from spade_async.generation.client import GenerateResult
from spade_async.memory.store import MemoryStore
from spade_async.memory.writer import MemoryWriter
from spade_async.rundir import RunDir
from spade_async.telemetry.metrics import Meters

ENV = (Path(__file__).parents[1] / "integration" / "envs" / "lower_share.py").read_text()


class ScriptedClient:
    def __init__(self, replies):
        self.replies = replies

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
            "envs.prewarm=0",
        ],
    )
    run_dir = RunDir(tmp_path / "run").create()
    logged = []

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
                    client=ScriptedClient([f"Here:\n```python\n{ENV}```", "no code here"]),
                    tokenizer=AutoTokenizer.from_pretrained(tokenizer_path),
                    run_dir=run_dir,
                    meters=Meters(),
                    tel=SimpleNamespace(log=lambda *a, **k: logged.append(a)),
                    state=SimpleNamespace(step=0),
                )
                samples = await cycle.regenerate(rt, version=3)
                writer.close()
            return samples, list(store.records())

    samples, records = anyio.run(main)
    ok, broken = samples
    assert ok.verdict.valid and ok.env_id and broken.verdict.stage == "syntax"
    assert isinstance(ok.skill, str) and ok.skill in cfg.designer.skills
    assert [r.skill for r in records] == [ok.skill] and records[0].origin.policy_version == 3
    assert (run_dir.envs / f"{ok.env_id}.py").read_text() == ENV
    assert len(logged) == 2  # one latest-environments record per design
