"""Behaviour, not names: what SGLang 0.5.23's source says about the requests the project
sends. Field types and required fields (read with ast from io_struct.py), the handlers that
refuse outside a weight-update session and the memory-tag bookkeeping (read from the
scheduler's weight updater), the health probe during a pause. Then a recorder: every
request the weight push and the generation client send, in the loop's order, through the
modelled state machine: each body valid for SGLang's class, each call accepted."""

from __future__ import annotations

import anyio
import httpx
import msgspec
import pytest
from contract_checks import accepts, body_problems, our_tree, request_class, route_problem
from sglang_fake import FakeNCCL, ModelledSGLang, transport

from spade_async.generation import routes, sglang_state
from spade_async.generation.client import ClientConfig, GenerationClient
from spade_async.generation.sglang import build_command
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.weights import push_disk, push_distributed, push_tensor

# our list[int | list[int]] is one msgspec array type; SGLang's is List[List[int]] |
# List[int]: the client sends one shape or the other, never mixed (checked by value below)
TYPE_EXEMPT = {("GenerateReqInput", "input_ids"), ("GenerateReqInput", "sampling_params")}

TYPED = [
    (e, f.name, f.type, f.required)
    for e in routes.ENDPOINTS
    if e.request
    for f in msgspec.structs.fields(e.request)
]


@pytest.mark.parametrize(("ep", "field", "typ", "required"), TYPED,
                         ids=[f"{e.path}.{f}" for e, f, _, _ in TYPED])  # fmt: skip
def test_request_field_type_is_one_sglang_accepts(sglang_src, ep, field, typ, required):
    cls = request_class(sglang_src, ep)
    schema = sglang_src.schema(cls)
    if (cls, field) in TYPE_EXEMPT:
        pytest.skip("checked by value: see TYPE_EXEMPT")
    theirs, _ = schema[field]
    assert accepts(theirs, our_tree(typ)), f"{ep.path}: our {field} {our_tree(typ)} vs {theirs}"


@pytest.mark.parametrize("ep", [e for e in routes.ENDPOINTS if e.request], ids=lambda e: e.path)
def test_sglangs_required_fields_are_required_here(sglang_src, ep):
    schema = sglang_src.schema(request_class(sglang_src, ep))
    ours = {f.name for f in msgspec.structs.fields(ep.request) if f.required}
    need = {k for k, (_, req) in schema.items() if req}
    assert need <= ours, f"{ep.path}: SGLang requires {sorted(need - ours)}, we may omit them"


def test_planted_wrong_field_type_is_caught(sglang_src):
    assert body_problems(
        sglang_src,
        "/init_weights_update_group",
        {"master_address": "h", "master_port": "29500", "rank_offset": 1, "world_size": 2},
    ) == [  # fmt: skip
        "/init_weights_update_group: InitWeightsUpdateGroupReqInput.master_port: '29500' is not int"
    ]
    assert "requires 'shapes'" in " ".join(
        body_problems(
            sglang_src, "/update_weights_from_distributed", {"names": ["w"], "dtypes": ["bf16"]}
        )
    )
    assert not accepts(sglang_src.schema("PauseGenerationReqInput")["mode"][0], ("str",))
    assert not accepts(("list", ("list", ("int",))), ("list", ("str",)))


# ---- behaviour read from the scheduler side ---------------------------------------------------
def test_the_session_rule_is_sglangs(sglang_src):
    """Exactly the handlers SGLang guards with ``self._session is None`` need a session in
    the model, and begin refuses an open one; the model refuses each without one."""
    guarded = sglang_src.session_guarded()
    assert guarded == {"update_weights_from_distributed", "update_weights_from_tensor",
                       "end_weight_update"}  # fmt: skip
    assert {f"/{m}" for m in guarded} - {"/end_weight_update"} == set(sglang_state.SESSION_ROUTES)
    assert sglang_src.session_exclusive() == {"begin_weight_update"}
    for m in guarded:
        state = sglang_state.SGLangState()
        state.groups.add("weight_update_group")
        kw = {"weight_version": "1"} if m.startswith("update") else {}
        if m.endswith("distributed"):
            kw["group_name"] = "weight_update_group"
        assert not getattr(state, m)(**kw).ok, m


def test_the_memory_tags_are_sglangs(sglang_src):
    assert tuple(sglang_src.memory_types()) == sglang_state.MEMORY_TAGS
    assert sglang_src.tag_ops("release_memory_occupation") == {"add"}
    assert sglang_src.tag_ops("resume_memory_occupation") == {"remove"}  # KeyError if absent


def test_every_modelled_route_is_an_sglang_post_route(sglang_src):
    for path in sglang_state.ROUTES:
        assert route_problem(sglang_src, "POST", path) is None, route_problem(
            sglang_src, "POST", path
        )


def test_health_stays_up_during_a_push(sglang_src):
    """SGLang's /health generates a token (default on), which waits behind a pause and
    answers 503 after 20 s; the launcher turns that off (liveness only)."""
    name = sglang_state.HEALTH_GENERATION_ENV
    assert sglang_src.env_default(name) is True
    handler = sglang_src.files["sglang/srt/entrypoints/http_server.py"]
    assert f"envs.{name}.get()" in handler and "return Response(status_code=200)" in handler
    assert '"0"' in sglang_src.files["sglang/srt/environ.py"].split("class EnvBool")[1][:400]
    _, env = build_command(
        __import__("spade_async.generation.sglang", fromlist=["x"]).SGLangConfig(
            model_path="m", gpu_ids=[0]
        )
    )
    assert env[name] == "0"


# ---- the recorder: what the project really sends, in its order --------------------------------
@pytest.fixture(scope="module")
def trainer(tiny_model):
    from spade_async.trainer.step import Trainer

    t = Trainer(TrainerConfig(model=str(tiny_model)), tiny_model)
    t.version = 2
    return t


def _check_all(sglang_src, engines) -> int:
    n = 0
    for e in engines.values():
        assert not e.refused(), e.refused()
        for path, body in e.requests:
            if path in ("/model_info", "/health"):
                continue
            assert body_problems(sglang_src, path, body) == [], (path, body)
            n += 1
    return n


@pytest.mark.parametrize("pause", ["", "abort", "retract", "in_place"])
@pytest.mark.parametrize("mode", ["disk", "distributed", "tensor"])
def test_every_push_request_is_valid_and_accepted(sglang_src, trainer, tmp_path, mode, pause):
    trainer._weight_group = None
    nccl = FakeNCCL(receivers=2)
    engines = {u: ModelledSGLang(nccl=nccl) for u in ("http://a", "http://b")}
    for e in engines.values():
        e.state.running = 2 if pause == "in_place" else 0  # in_place keeps them running
    kw = {"transport": transport(engines), "pause_mode": pause, "timeout": 30}
    targets = [{"url": u, "tp_size": 1} for u in engines]
    if mode == "disk":
        push_disk(trainer, list(engines), shm_dir=str(tmp_path), **kw)
    elif mode == "distributed":
        push_distributed(trainer, targets, master_address="127.0.0.1", master_port=1,
                         bucket_bytes=4 << 20, init_group=lambda *a: "G",
                         broadcast=nccl.broadcast, **kw)  # fmt: skip
        # an engine restart: a new group epoch drops the old group first
        push_distributed(trainer, targets, master_address="127.0.0.1", master_port=2,
                         bucket_bytes=4 << 20, init_group=lambda *a: "G2",
                         broadcast=nccl.broadcast, group_epoch=1, previous_group_epoch=0,
                         destroy_group=lambda g: None, **kw)  # fmt: skip
    else:
        push_tensor(trainer, targets, bucket_bytes=4 << 20, serialize=lambda c: "cGF5bG9hZA==",
                    **kw)  # fmt: skip
    assert _check_all(sglang_src, engines) >= 2
    assert all(e.state.weight_version == "2" and e.state.paused is None for e in engines.values())


def test_client_control_calls_in_the_colocated_order(sglang_src):
    """GenerationClient's control calls as cycle.train_and_push makes them."""
    from spade_async.generation.sglang_state import MEMORY_TAGS
    from spade_async.loop.cycle import train_and_push  # noqa: F401 - the order modelled below

    engines = {u: ModelledSGLang() for u in ("http://a", "http://b")}

    async def main():
        client = GenerationClient(list(engines), ClientConfig(max_retries=0))
        await client._http.aclose()
        client._http = httpx.AsyncClient(transport=transport(engines))
        async with client:
            await client.release_memory(list(MEMORY_TAGS))
            await client.resume_memory(["weights"])
            await client.update_weights_from_disk("/m", weight_version="1")
            await client.resume_memory([t for t in MEMORY_TAGS if t != "weights"])
            await client.pause("retract")
            await client.flush_cache()
            await client.resume()

    anyio.run(main)
    assert _check_all(sglang_src, engines) == 2 * 7
