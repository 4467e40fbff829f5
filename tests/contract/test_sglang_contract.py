"""The project against the pinned SGLang's own source (read with ast, never imported).

One test per route, field and flag the project uses, so a wrong name fails a test that
names it. The fakes elsewhere in the suite test behaviour; these decide what SGLang accepts.
"""

from __future__ import annotations

import re
import tomllib

import msgspec
import pytest
from contract_checks import (
    API_TYPES,
    ROOT,
    SAMPLING,
    field_problem,
    flag_problem,
    launcher_flags,
    raw_http_calls,
    reply_items,
    reply_problem,
    request_class,
    request_items,
    route_problem,
    sampling_fields,
    struct_fields,
)

from spade_async.generation import routes
from spade_async.generation.sglang_source import FLAGS_FILE, PINNED, render_flags

RAW = raw_http_calls()


def test_pyproject_pins_the_checked_release():
    gpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert f"sglang=={PINNED}" in gpu["gpu"]


# ---- routes --------------------------------------------------------------------------------
@pytest.mark.parametrize("ep", routes.ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_endpoint_route_exists(sglang_src, ep):
    assert route_problem(sglang_src, ep.method, ep.path) is None, route_problem(
        sglang_src, ep.method, ep.path
    )


@pytest.mark.parametrize("call", RAW, ids=lambda c: f"{c.method} {c.path} @ {c.where}")
def test_raw_http_route_exists(sglang_src, call):
    """HTTP calls outside the endpoint table (the weight push, the launcher's health wait)."""
    problem = route_problem(sglang_src, call.method, call.path)
    assert problem is None, f"{call.where}: {problem}"


# ---- request bodies -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ep", "field"), request_items(), ids=lambda x: x if isinstance(x, str) else x.path
)
def test_request_field_exists(sglang_src, ep, field):
    problem = field_problem(sglang_src, request_class(sglang_src, ep), field)
    assert problem is None, f"{ep.path}: {problem}"


@pytest.mark.parametrize("field", sampling_fields())
@pytest.mark.parametrize("where", [SAMPLING, API_TYPES], ids=["engine", "http-contract"])
def test_sampling_param_exists(sglang_src, field, where):
    """Both SGLang's engine SamplingParams and its /generate contract (which rejects unknown
    sampling keys) know every sampling field the project sends."""
    problem = field_problem(sglang_src, "SamplingParams", field, where)
    assert problem is None, problem


BODY_FIELDS = [(c, k) for c in RAW for k in c.body_keys]


@pytest.mark.parametrize(
    ("call", "field"),
    BODY_FIELDS,
    ids=lambda x: x if isinstance(x, str) else f"{x.path} @ {x.where}",
)
def test_raw_http_body_field_exists(sglang_src, call, field):
    problem = field_problem(sglang_src, request_class(sglang_src, call.path), field)
    assert problem is None, f"{call.where}: {problem}"


def _pause_modes():
    import typing

    from spade_async.loop.config import PipelineConfig
    from spade_async.trainer.rpc import PushWeights

    def strings(t) -> set[str]:  # the Literal's values, through Annotated (Doc)
        return {t} if isinstance(t, str) else set().union(*map(strings, typing.get_args(t)))

    types = [
        {f.name: f.type for f in msgspec.structs.fields(cls)}["pause_mode"]
        for cls in (PipelineConfig, PushWeights)
    ]
    return sorted(set().union(*map(strings, types)) - {""})


@pytest.mark.parametrize("mode", _pause_modes())
def test_pause_mode_is_one_sglang_knows(sglang_src, mode):
    """A recipe's pipeline.pause_mode reaches SGLang's PauseGenerationReqInput.mode."""
    assert mode in sglang_src.literal_values("PauseGenerationReqInput", "mode")


# ---- replies -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ep", "struct", "field"),
    reply_items(),
    ids=lambda x: x if isinstance(x, str) else x.path,
)
def test_reply_field_is_written(sglang_src, ep, struct, field):
    problem = reply_problem(sglang_src, ep, struct, field)
    assert problem is None, f"{ep.path} ({struct}): {problem}"


# ---- launch flags ---------------------------------------------------------------------------
@pytest.mark.parametrize("flag", launcher_flags())
def test_launch_flag_exists(sglang_src, flag):
    assert flag_problem(sglang_src, flag) is None, flag_problem(sglang_src, flag)


def test_shipped_flag_list_is_the_releases(sglang_src):
    """``sglang_flags.txt`` (what a recipe is checked against at start) equals the wheel's."""
    want = render_flags(sglang_src.flags())
    assert FLAGS_FILE.read_text() == want, (
        "sglang_flags.txt differs from the pinned wheel: "
        "python -m spade_async.generation.sglang_source write-flags"
    )


# ---- the CPU engine is a subset of SGLang ---------------------------------------------------
def _cpu_routes():
    from spade_async.generation.server import build_app

    class _Handlers:
        def __getattr__(self, name):
            return lambda request: None

    app = build_app(_Handlers())
    return [(r.path, m) for r in app.routes for m in sorted(r.methods) if m != "HEAD"]


@pytest.mark.parametrize(("path", "method"), _cpu_routes(), ids=lambda x: x)
def test_cpu_engine_route_is_sglangs(sglang_src, path, method):
    assert route_problem(sglang_src, method, path) is None, route_problem(sglang_src, method, path)
    # its bodies are the endpoint table's structs, whose fields the tests above check
    assert routes.by_path(path).method == method


# ---- the checks catch a planted wrong name --------------------------------------------------
def test_planted_wrong_names_are_caught(sglang_src):
    assert "no route /get_weight_version" in route_problem(sglang_src, "GET", "/get_weight_version")
    assert "not GET" in route_problem(sglang_src, "GET", "/pause_generation")

    class Planted(msgspec.Struct):
        sampling_sed: int = 0

    (field,) = struct_fields(Planted)
    assert "no field 'sampling_sed'" in field_problem(sglang_src, "SamplingParams", field, SAMPLING)
    assert "no field 'weight_verison'" in field_problem(
        sglang_src, "UpdateWeightFromDiskReqInput", "weight_verison"
    )
    bad_reply = reply_problem(sglang_src, routes.MODEL_INFO, "ModelInfo", "weight_versions")
    assert "writes no 'weight_versions'" in bad_reply
    assert "no field 'policy_version'" in reply_problem(
        sglang_src, routes.GENERATE, "MetaInfo", "policy_version"
    )
    assert "no flag --enable-determinstic-inference" in flag_problem(
        sglang_src, "--enable-determinstic-inference"
    )


def test_planted_raw_call_is_collected():
    """The scan finds a raw call and its body keys, so a wrong one would fail above."""
    src = """
def push(client, url, v):
    body = {"model_path": "/m"}
    body["weight_verison"] = v
    client.post(f"{url}/update_weights_from_disk", json=body)
    client.get(f"{url}/get_weight_version")
    {}.get(f"stream/{v}/capacity")
"""
    (post, get) = raw_http_calls(sources={"planted.py": src})
    assert (post.method, post.path, post.body_keys) == (
        "POST",
        "/update_weights_from_disk",
        ("model_path", "weight_verison"),
    )
    assert (get.method, get.path) == ("GET", "/get_weight_version")


def test_launcher_flags_come_from_the_launcher_and_recipes():
    flags = launcher_flags()
    assert "--enable-deterministic-inference" in flags  # build_command, deterministic on
    assert "--enable-memory-saver" in flags  # the 30B recipes' colocated variant
    assert all(re.fullmatch(r"--[a-z0-9-]+", f) for f in flags)
