"""Colocated turns: the controller gives the engines' memory to the trainer and takes it back
in slime's order (release all -> train -> resume weights -> push -> resume the KV cache),
against the real CPU engine (which implements SGLang's release/resume endpoints)."""

from __future__ import annotations

from types import MethodType, SimpleNamespace

import anyio

from spade_async import recipe
from spade_async.generation.client import ClientConfig, GenerationClient
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.server import make_engine_app, serve_in_thread
from spade_async.loop.cycle import train_and_push
from spade_async.loop.runtime import Runtime
from spade_async.telemetry.metrics import Meters
from spade_async.trainer.batch import Sample


class FakeTrainer:
    """Records what the engine looked like at each trainer call; pushes by disk like ours."""

    def __init__(self, engine, client, model_dir):
        self.engine, self.client, self.model_dir = engine, client, model_dir
        self.seen: list[tuple[str, set[str]]] = []

    async def train_step(self, batch):
        self.seen.append(("train", set(self.engine.released)))
        return {"loss": 0.0}

    async def push_weights(self, engines, **kw):
        self.seen.append(("push", set(self.engine.released)))
        versions = await self.client.update_weights_from_disk(str(self.model_dir))
        return SimpleNamespace(version=int(next(iter(versions.values()))), seconds=0.01, paused_s=0.0)


def test_train_and_push_releases_and_resumes_around_the_step(tiny_model):
    app = make_engine_app(str(tiny_model), context_length=64)
    sample = Sample(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], advantage=1.0,
                    rollout_logprobs=[0.0, -1.0, -1.0])
    with serve_in_thread(app) as url:

        async def main():
            async with GenerationClient([url], ClientConfig(max_retries=0)) as client:
                trainer = FakeTrainer(app.engine, client, tiny_model)
                rt = SimpleNamespace(
                    cfg=recipe.load(None, []), client=client, trainer=trainer,
                    engine_urls=[url], push_kw={"engines": [url], "mode": "disk"},
                    release_memory=True,
                    meters=Meters(), state=SimpleNamespace(version=0),
                    adapters=None,  # full-weight pushes (trainer.lora unset)
                )
                rt.push = MethodType(Runtime.push, rt)  # the real push over the fake trainer
                await train_and_push(rt, [sample], pause=False)
                after = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
                return trainer.seen, rt.state.version, after

        seen, version, after = anyio.run(main)
    assert seen == [("train", {"weights", "kv_cache", "cuda_graph"}),
                    ("push", {"kv_cache", "cuda_graph"})]
    assert version == 1 and after.weight_version == "1"
    assert not app.engine.released  # everything resumed: the engine serves again
    # SGLang's offload-set bookkeeping accepted every call (a resume of all tags after the
    # weights' resume would have died with KeyError, and the engine with it)
    assert not app.sgl.refused() and not app.sgl.dead and not app.sgl.offload_tags
    assert [c.path for c in app.sgl.calls] == [
        "/release_memory_occupation", "/resume_memory_occupation",
        "/update_weights_from_disk", "/resume_memory_occupation",
    ]
