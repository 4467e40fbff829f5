"""The CPU engine's LoRA routes (generation/lora.py) behave as SGLang 0.5.23's: a loaded
adapter serves requests that name it (the base plus (alpha / r) B A: peft's own outputs),
a name loads once, an unknown name is refused, and an unload waits for the in-flight
requests that use the adapter while refusing new ones."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch
from numerics import assert_close_norm, forward_bound

pytest.importorskip("peft", reason="peft is a project dependency (pip install peft)")


@pytest.fixture(scope="module")
def adapter(tiny_model, tmp_path_factory):
    """A real peft adapter (random A and B, so it changes the model) on the tiny model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"], init_lora_weights=False
    )
    model = get_peft_model(base, cfg)
    out = tmp_path_factory.mktemp("adapter") / "a"
    model.save_pretrained(str(out))
    return out, model


def _gen(url, prompt, lora=None, n=3, **kw):
    body = {
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": n, "temperature": 0.0, **kw},
    }
    if lora is not None:
        body["lora_path"] = lora
    return httpx.post(f"{url}/generate", json=body, timeout=120)


def _logprobs(model, prompt, out_ids):
    ids = torch.tensor([prompt + out_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].double(), -1)
    return torch.tensor([lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(out_ids)])


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_adapter_serving_like_sglang(tiny_model, adapter):
    from transformers import AutoModelForCausalLM

    from spade_async.generation.server import make_engine_app, serve_in_thread

    path, peft_model = adapter
    app = make_engine_app(str(tiny_model), context_length=128, enable_lora=True, max_lora_rank=8)
    prompt = [1, 5, 9, 13]
    with serve_in_thread(app) as url:
        r = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "v1", "lora_path": str(path)})
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {"v1": str(path)}
        again = httpx.post(
            f"{url}/load_lora_adapter", json={"lora_name": "v1", "lora_path": str(path)}
        )
        assert again.status_code == 400 and "already exists" in again.json()["error_message"]
        out = _gen(url, prompt, "v1").json()
        base_out = _gen(url, prompt).json()
        missing = _gen(url, prompt, "v0")
        assert missing.status_code == 400 and "not loaded" in missing.text
        got = torch.tensor([row[0] for row in out["meta_info"]["output_token_logprobs"]])
        base_got = torch.tensor([row[0] for row in base_out["meta_info"]["output_token_logprobs"]])
    want = _logprobs(peft_model, prompt, out["output_ids"])  # peft's own adapter forward
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    base_want = _logprobs(base, prompt, base_out["output_ids"])
    bound = forward_bound(base.config, len(prompt) + 3)
    assert_close_norm(got, want, bound, "adapter log-probs")
    assert_close_norm(base_got, base_want, bound, "base log-probs")
    # the adapter really changes what is served
    assert (_logprobs(base, prompt, out["output_ids"]) - want).norm() > 100 * bound * want.norm()


def test_unload_waits_for_in_flight_requests_and_refuses_new_ones(tiny_model, adapter):
    from spade_async.generation.server import make_engine_app, serve_in_thread

    path, _ = adapter
    app = make_engine_app(str(tiny_model), context_length=256, enable_lora=True, max_lora_rank=8)
    with serve_in_thread(app) as url:
        assert (
            httpx.post(
                f"{url}/load_lora_adapter", json={"lora_name": "v1", "lora_path": str(path)}
            ).status_code
            == 200
        )
        done: dict = {}

        def long_request():
            r = _gen(url, [1, 5, 9], "v1", n=120, ignore_eos=True)
            done["t"], done["r"] = time.monotonic(), r

        th = threading.Thread(target=long_request)
        th.start()
        while app.lora.adapters["v1"][1].load() == 0:  # it is running on the adapter
            time.sleep(0.005)
        engine = app.lora.adapters["v1"][1]
        r = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "v1"}, timeout=120)
        # the unload returned only once the adapter's engine had nothing left to run
        assert engine.load() == 0 and engine.stats["tokens"] >= 120
        th.join(timeout=60)
        assert not th.is_alive()
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {}
        # the in-flight request finished on the adapter, all 120 tokens, not aborted
        assert done["r"].status_code == 200
        out = done["r"].json()
        assert (
            len(out["output_ids"]) == 120 and out["meta_info"]["finish_reason"]["type"] == "length"
        )
        after = _gen(url, [1, 5, 9], "v1")
        assert after.status_code == 400 and "not loaded" in after.text
        gone = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "v1"})
        assert gone.status_code == 400 and "does not exist" in gone.json()["error_message"]


def test_refusals(tiny_model, adapter):
    from spade_async.generation.server import make_engine_app, serve_in_thread

    path, _ = adapter
    off = make_engine_app(str(tiny_model), context_length=64)
    with serve_in_thread(off) as url:
        r = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "v1", "lora_path": str(path)})
        assert r.status_code == 400 and "--enable-lora" in r.json()["error_message"]
        assert _gen(url, [1, 5], "v1").status_code == 400
    small = make_engine_app(str(tiny_model), context_length=64, enable_lora=True, max_lora_rank=2)
    with serve_in_thread(small) as url:
        r = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "v1", "lora_path": str(path)})
        assert r.status_code == 400 and "--max-lora-rank 2" in r.json()["error_message"]
        r = httpx.post(
            f"{url}/load_lora_adapter_from_tensors",
            json={"lora_name": "t", "config_dict": {}, "serialized_named_tensors": [""]},
        )
        assert r.status_code == 400 and "/load_lora_adapter" in r.json()["error_message"]


def test_adapter_engines_follow_the_base_engines_prefix_cache_setting(tiny_model, adapter):
    """``--disable-radix-cache`` reaches every engine: each adapter's Engine is built from
    the base engine's settings, its prefix cache size included."""
    from spade_async.generation.server import make_engine_app

    path, _ = adapter
    for radix in (True, False):
        app = make_engine_app(str(tiny_model), enable_lora=True, max_lora_rank=8, radix_cache=radix)
        adapter_engine = app.lora._build(str(path), "v1")
        assert (app.engine.prefix.max_bytes > 0) == radix
        assert adapter_engine.prefix.max_bytes == app.engine.prefix.max_bytes
