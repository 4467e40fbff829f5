"""LoRA serving in the run loop (loop/lora.py): the client names the current adapter, a
result's policy version is its adapter's, and adapters are unloaded once unused; against
SGLang's adapter registry as tests/sglang_fake.py models it (refusing what SGLang refuses)."""

from __future__ import annotations

import anyio
import httpx
import pytest
from sglang_fake import ModelledLoRA

from spade_async.generation.client import ClientConfig, EngineRequestError, GenerationClient
from spade_async.generation.lora import adapter_name, adapter_version
from spade_async.generation.protocol import SamplingParams
from spade_async.loop.lora import AdapterBook

URLS = ["http://a", "http://b"]
ONE = SamplingParams(max_new_tokens=1)


def _client(fakes: dict[str, ModelledLoRA]) -> GenerationClient:
    client = GenerationClient(URLS, ClientConfig(backoff_s=0.01, max_retries=0))
    client._http = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: fakes[f"http://{r.url.host}"](r))
    )
    return client


async def _load(fakes, book: AdapterBook, client, version: int) -> str:
    """What push_adapter does on every engine, then what Runtime.push does after it."""
    name = adapter_name(version, sum(n.startswith(f"spade-v{version}") for n in book.taken()))
    for url in book.urls:
        req = httpx.Request("POST", f"{url}/load_lora_adapter",
                            json={"lora_name": name, "lora_path": f"/shm/{name}"})  # fmt: skip
        assert (await fakes[url](req)).status_code == 200
    client.set_adapter(book.pushed({u: name for u in book.urls}))
    return name


def _generated(fake: ModelledLoRA) -> list[str | None]:
    return [b.get("lora_path") for p, b in fake.requests if p == "/generate"]


def test_names_and_versions():
    assert adapter_name(3) == "spade-v3" and adapter_name(3, 2) == "spade-v3.2"
    assert adapter_version("spade-v12") == 12 and adapter_version("spade-v3.2") == 3
    with pytest.raises(ValueError, match="spade-v"):
        adapter_version("my-adapter")


def test_requests_name_the_current_adapter_and_take_its_version():
    """Before any push: the base, version 0. After a load: every request names the adapter
    and its result's policy version is the adapter's, while SGLang's weight_version stays
    the base's "0" (a client that reads weight_version, or omits lora_path, fails here)."""
    fakes = {u: ModelledLoRA() for u in URLS}

    async def main():
        async with _client(fakes) as client:
            client.use_adapters(None)
            book = AdapterBook(list(URLS))
            base = await client.generate([1], ONE)
            assert base.lora_path is None and base.policy(fallback=7) == 0
            await _load(fakes, book, client, 3)
            res = [await client.generate([1], ONE) for _ in range(4)]
            assert {r.weight_version for r in res} == {"0"}
            assert [r.policy(fallback=7) for r in res] == [3, 3, 3, 3]
            assert {r.lora_path for r in res} == {"spade-v3"}

    anyio.run(main)
    sent = _generated(fakes["http://a"]) + _generated(fakes["http://b"])
    assert sorted(sent, key=str) == [None] + ["spade-v3"] * 4
    assert not any(f.refusals for f in fakes.values())


def test_a_request_keeps_its_adapter_and_an_adapter_is_unloaded_once_unused():
    """A request started on v1 finishes on v1 with version 1 though v2 loaded meanwhile;
    v1 is not unloaded while it runs (SGLang would refuse its later use), and is once it is
    done; new requests go to v2. No call is refused."""
    fakes = {u: ModelledLoRA() for u in URLS}

    async def main():
        async with _client(fakes) as client:
            client.use_adapters(None)
            book = AdapterBook(list(URLS))
            await _load(fakes, book, client, 1)
            gate = anyio.Event()
            for f in fakes.values():
                f.gate = gate
            got = {}

            async def slow():
                got["slow"] = await client.generate([1], ONE)

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                await anyio.sleep(0.05)
                assert client.adapter_load() == {"spade-v1": 1}
                await _load(fakes, book, client, 2)
                assert await book.retire(client) == []  # v1 is in use
                assert book.taken() == ["spade-v1", "spade-v2"]
                gate.set()
            assert got["slow"].policy(0) == 1 and got["slow"].lora_path == "spade-v1"
            assert (await client.generate([1], ONE)).policy(0) == 2
            assert await book.retire(client) == ["spade-v1"]
            assert book.taken() == ["spade-v2"]
            assert all(list(f.loaded) == ["spade-v2"] for f in fakes.values())

    anyio.run(main)
    assert not any(f.refusals for f in fakes.values())


def test_the_fake_refuses_what_sglang_refuses():
    """The checks above mean something only if the fake refuses: an unknown lora_path, a
    second load of a loaded name, an unload of an unknown name."""
    fakes = {u: ModelledLoRA() for u in URLS}

    async def main():
        async with _client(fakes) as client:
            client.use_adapters("spade-v9")  # never loaded
            with pytest.raises(EngineRequestError, match="not loaded: spade-v9"):
                await client.generate([1], ONE)
            book = AdapterBook(list(URLS))
            await _load(fakes, book, client, 1)
            req = httpx.Request("POST", "http://a/load_lora_adapter",
                                json={"lora_name": "spade-v1", "lora_path": "/x"})  # fmt: skip
            assert (await fakes["http://a"](req)).status_code == 400
            with pytest.raises(EngineRequestError, match="does not exist"):
                await client.unload_adapter("spade-v7", URLS)

    anyio.run(main)


def test_a_restarted_engine_holds_no_adapters_and_a_repush_takes_a_new_name():
    """After an engine restart the current version is loaded again under spade-v{N}.1 (the
    other engine still holds spade-v{N}: a second load of it is refused), and the old name
    is unloaded only where it is loaded."""
    fakes = {u: ModelledLoRA() for u in URLS}

    async def main():
        async with _client(fakes) as client:
            client.use_adapters(None)
            book = AdapterBook(list(URLS))
            await _load(fakes, book, client, 4)
            fakes["http://b"] = ModelledLoRA()  # crashed, came back empty
            book.forget("http://b")
            name = await _load(fakes, book, client, 4)
            assert name == "spade-v4.1"
            assert await book.retire(client) == ["spade-v4"]
            res = await client.generate([1], ONE)
            assert res.policy(0) == 4

    anyio.run(main)
    assert not any(f.refusals for f in fakes.values())
    assert [p for p, _ in fakes["http://b"].requests if p == "/unload_lora_adapter"] == []


# ---- launch and placement ---------------------------------------------------------------
GPU = ["engine.kind=sglang", "engine.gpus=[[0], [1]]", "placement.trainer_gpus=[2, 3]"]
LORA = "trainer.lora={rank=8,target_modules=['q_proj','down_proj']}"


def test_engines_start_on_the_base_with_sglangs_lora_flags(tmp_path, capsys):
    """With trainer.lora the launch plan's SGLang servers load the base (not the run's merged
    export) with --enable-lora --max-lora-rank R --lora-target-modules ...: flags of the
    pinned release (build_command checks every flag against it), and the CPU engine's own
    parser takes them; the push mode is 'lora'."""
    from spade_async import placement, recipe
    from spade_async.generation.server import main as server_main

    cfg = recipe.load(None, [*GPU, "model=/models/base", LORA])
    assert placement.push_mode(cfg) == "lora"
    plan = placement.launch_plan(cfg, model_dir="/models/base", engine_model_dir=tmp_path / "hf")
    engines = [p for p in plan if p.role == "engine"]
    assert len(engines) == 2
    for p in engines:
        argv = p.argv
        assert argv[argv.index("--model-path") + 1] == "/models/base"
        i = argv.index("--enable-lora")
        assert argv[i : i + 6] == [
            "--enable-lora", "--max-lora-rank", "8",
            "--lora-target-modules", "q_proj", "down_proj",
        ]  # fmt: skip
    # without LoRA the engines load the resumed run's export
    plain = recipe.load(None, [*GPU, "model=/models/base"])
    argv = next(p for p in placement.launch_plan(
        plain, model_dir="/models/base", engine_model_dir=tmp_path / "hf") if p.role == "engine"
    ).argv  # fmt: skip
    assert argv[argv.index("--model-path") + 1] == str(tmp_path / "hf")
    assert "--enable-lora" not in argv
    # the CPU engine's argv carries the same flags, and its parser accepts them
    cpu = recipe.load(None, ["model=/models/base", LORA])
    cpu_argv = next(p for p in placement.launch_plan(cpu, model_dir="/m") if p.role == "engine")
    assert "--enable-lora" in cpu_argv.argv and "--max-lora-rank" in cpu_argv.argv
    tail = cpu_argv.argv[cpu_argv.argv.index("spade_async.generation.server") + 1 :]
    # every flag parses (argparse exits on an unknown one); then the absent model: exit 2
    assert server_main(tail) == 2
    assert "neither an embedded model" in capsys.readouterr().err
    assert "--enable-lora" not in next(
        p for p in placement.launch_plan(recipe.load(None, ["model=/m"]), model_dir="/m")
        if p.role == "engine"
    ).argv  # fmt: skip


def test_lora_with_an_explicit_full_push_or_weight_release_is_one_line():
    from spade_async import recipe
    from spade_async.errors import ConfigError

    with pytest.raises(ConfigError, match="weight_push = 'auto'") as exc:
        recipe.load(None, [*GPU, "model=/m", LORA, "placement.weight_push='distributed'"])
    assert "\n" not in str(exc.value)
    shared = ["engine.kind=sglang", "engine.gpus=[[0]]", "placement.trainer_gpus=[0]",
              "placement.colocate=true", "schedule=sync", "model=/m",
              'engine.extra_args=["--enable-memory-saver"]']  # fmt: skip
    with pytest.raises(ConfigError, match="release_memory = false"):
        recipe.load(None, [*shared, LORA])
    cfg = recipe.load(None, [*shared, LORA, "placement.release_memory=false"])
    assert cfg.trainer.lora.rank == 8


# ---- Runtime.push under LoRA: trainer and engine restarts ----------------------------------
class _PushingTrainer:
    """The trainer side of a push: the real ``push_adapter`` (its export stubbed) against the
    fake engines; a restarted trainer is a new one from its checkpoint's version."""

    def __init__(self, version: int, fakes, shm):
        from types import SimpleNamespace

        self.t = SimpleNamespace(version=version, rank=0, model_dir="m")
        self.fakes, self.shm = fakes, shm

    async def push_weights(self, engines, *, mode, lora_taken, lora_keep, pause_mode, **kw):
        from spade_async.trainer.lora import push_adapter
        from spade_async.trainer.rpc import WeightsPushed

        assert mode == "lora" and pause_mode == ""  # an adapter load pauses nothing
        transport = httpx.MockTransport(lambda r: self.fakes[f"http://{r.url.host}"].sync(r))
        got = push_adapter(self.t, engines, shm_dir=str(self.shm), keep=lora_keep,
                           taken=lora_taken, transport=transport)  # fmt: skip
        return WeightsPushed(version=self.t.version, engines=got, seconds=0.0)


def test_restarted_trainer_and_engine_get_fresh_names_and_no_refusal(tmp_path, monkeypatch):
    """Runtime.push as the loop runs it: v1 pushed; the trainer dies and comes back from its
    checkpoint at v1 while the engines still hold spade-v1 (a re-load of that name would be
    refused): it loads spade-v1.1 and spade-v1 is unloaded. Then engine b crashes and comes
    back empty: the next push loads on both and unloads only where the old one is."""
    from types import SimpleNamespace

    import spade_async.trainer.lora as trainer_lora
    import spade_async.trainer.stream as stream
    from spade_async.loop.runtime import Runtime
    from spade_async.telemetry.metrics import Meters

    monkeypatch.setattr(trainer_lora, "export_adapter", lambda t, d, dt: d.mkdir(parents=True))
    monkeypatch.setattr(stream, "engine_dtype", lambda *a, **k: None)
    fakes = {u: ModelledLoRA() for u in URLS}

    async def main():
        async with _client(fakes) as client:
            client.use_adapters(None)
            rt = SimpleNamespace(
                push_kw={"engines": list(URLS), "mode": "lora", "dtype": ""},
                adapters=AdapterBook(list(URLS)),
                client=client,
                cfg=SimpleNamespace(pipeline=SimpleNamespace(pause_mode="in_place")),
                state=SimpleNamespace(version=0),
                meters=Meters(),
                pushed_group_epoch=-1,
                trainer=_PushingTrainer(1, fakes, tmp_path),
            )
            await Runtime.push(rt, pause=True)
            assert client.adapter == "spade-v1"
            rt.trainer = _PushingTrainer(1, fakes, tmp_path)  # restarted from the checkpoint
            await Runtime.push(rt, pause=True)
            assert client.adapter == "spade-v1.1" and rt.adapters.taken() == ["spade-v1.1"]
            assert (await client.generate([1], ONE)).policy(0) == 1
            fakes["http://b"] = ModelledLoRA()  # crashed and restarted: no adapters
            Runtime.engine_crashed(rt, SimpleNamespace(url="http://b"))
            client.release("http://b")
            rt.trainer.t.version = 2
            await Runtime.push(rt, pause=True)
            assert client.adapter == "spade-v2" and rt.adapters.taken() == ["spade-v2"]
            assert (await client.generate([1], ONE)).policy(0) == 2

    anyio.run(main)
    assert not any(f.refusals for f in fakes.values()), [f.refusals for f in fakes.values()]
    assert [b["lora_name"] for p, b in fakes["http://a"].requests if p.startswith("/unload")] == [
        "spade-v1",
        "spade-v1.1",
    ]
    assert not [p for p, _ in fakes["http://b"].requests if p.startswith("/unload")]


def test_a_frozen_small_embedding_caps_what_a_block_lora_can_express(tmp_path):
    """Why the designer-learning test's LoRA base has embedding_std 0.1: with the tied
    embedding, head and final RMSNorm frozen, the next-token logits are h E^T with |h| =
    sqrt(hidden); the most letter mass any h reaches (optimised directly, an upper bound for
    every block output) is near uniform at the default 0.02 and most of it at 0.1."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spade_async.settings.char_model import char_model_dir

    def best_letter_mass(std):
        path = char_model_dir(tmp_path / f"m{std}", embedding_std=std)
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        emb = model.get_input_embeddings().weight.detach().double()
        norm = model.model.norm.weight.detach().double()
        letters = [i for t, i in tok.get_vocab().items() if len(t) == 1 and t.islower()]
        u = torch.randn(
            emb.shape[1], dtype=torch.double, generator=torch.Generator().manual_seed(0)
        )
        u.requires_grad_(True)
        opt = torch.optim.Adam([u], lr=0.1)
        for _ in range(400):
            h = u / u.norm() * emb.shape[1] ** 0.5 * norm
            loss = -torch.logsumexp(torch.log_softmax(h @ emb.T, -1)[letters], 0)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return torch.exp(-loss).item(), len(letters) / emb.shape[0]

    capped, uniform = best_letter_mass(None)  # the config's initializer_range 0.02
    assert capped < uniform + 0.1, (capped, uniform)
    assert best_letter_mass(0.1)[0] > 0.8  # found by the search: the bound is higher
