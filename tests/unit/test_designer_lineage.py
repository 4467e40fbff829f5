"""A designed environment records which memory examples its prompt showed (lineage), and
the designer's time is split: generation as engine time, the gates as env_pool time."""

from pathlib import Path

import anyio

from spade_async import recipe
from spade_async.envs.pool import EnvPool
from spade_async.memory.store import MemoryStore
from spade_async.memory.writer import MemoryWriter
from spade_async.roles.designer import design_group
from spade_async.roles.services import Services
from spade_async.rundir import RunDir
from spade_async.telemetry.metrics import Meters

ENV = (Path(__file__).parents[1] / "integration" / "envs" / "lower_share.py").read_text()


class _Client:
    async def generate_n(self, input_ids, sampling, **kw):
        from spade_async.generation.client import GenerateResult

        await anyio.sleep(0.05)  # engine time the meters must see
        return [GenerateResult(output_ids=[1, 2], logprobs=[-0.1, -0.2], finish_reason="stop",
                               matched=None, text=f"```python\n{ENV}```", weight_version="1",
                               prompt_tokens=len(input_ids), url="scripted")]  # fmt: skip


def test_lineage_and_phase_meters(tmp_path, tokenizer_path):
    from transformers import AutoTokenizer

    cfg = recipe.load(None, ["designer.samples_per_prompt=1", "envs.prewarm=0"])
    run_dir = RunDir(tmp_path / "run").create()
    shown = ["a" * 64, "b" * 64]
    meters = Meters()

    async def main():
        with MemoryStore(run_dir.memory, cfg.memory) as store:
            writer = MemoryWriter(store)
            async with anyio.create_task_group() as tg, EnvPool(cfg.envs) as pool:
                await tg.start(writer.run)
                samples = await design_group(
                    Services(_Client(), pool, AutoTokenizer.from_pretrained(tokenizer_path), meters),
                    writer=writer, run_dir=run_dir, cfg=cfg.designer,
                    prompt="write a game", skill="Optimization", doc_id=None, version=1,
                    examples=shown,
                )  # fmt: skip
                writer.close()
            return samples, list(store.records())

    samples, records = anyio.run(main)
    assert samples[0].env_id and [r.shown for r in records] == [shown]
    snap = meters.snapshot()
    assert snap["busy_s/engine"] >= 0.05
    assert snap["busy_s/env_pool"] > 0.0  # the validation gates ran in the pool
    # metered apart: the gates (several sandboxed workers) are not engine time
    assert snap["busy_s/engine"] < snap["busy_s/env_pool"]
