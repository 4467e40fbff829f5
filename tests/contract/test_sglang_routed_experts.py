"""Routing replay against the pinned SGLang's own source (read from the wheel): the request
fields by type and default, the server flag, the scheduler's start-length rule (and that the
CPU engine refuses exactly what it refuses), the rows a reply covers, their dtype, layout
and base64 form, and the meta_info key. The generic checks (every GenerateReqInput field's
type, every MetaInfo field written) cover these fields too: see test_sglang_requests.py and
test_sglang_contract.py."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
from contract_checks import meta_info_stores, reply_problem

from spade_async.generation import routes
from spade_async.generation.protocol import BadRequest, GenerateReqInput
from spade_async.generation.routed_experts import RouteShape, decode_sglang, encode_sglang

SCHEDULER = "sglang/srt/managers/scheduler.py"
RESULTS = "sglang/srt/managers/scheduler_components/batch_result_processor.py"
DETOKENIZER = "sglang/srt/managers/detokenizer_manager.py"
CAPTURER = "sglang/srt/state_capturer/routed_experts.py"
CAPTURER_BASE = "sglang/srt/state_capturer/base.py"


def _fn(src, path: str, name: str) -> ast.FunctionDef:
    found = [
        n for n in ast.walk(src.tree(path))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    ]  # fmt: skip
    assert found, f"{path} has no function {name}"
    return found[0]


def _sources(node: ast.AST) -> set[str]:
    return {ast.unparse(n) for n in ast.walk(node) if isinstance(n, ast.expr)}


def test_request_fields_and_defaults_are_sglangs(sglang_src):
    schema = sglang_src.schema("GenerateReqInput")
    assert schema["return_routed_experts"][0] == ("bool",)
    assert schema["routed_experts_start_len"][0] == ("int",)
    ours = GenerateReqInput()
    assert ours.return_routed_experts is False and ours.routed_experts_start_len == 0
    fields = sglang_src.schema("GenerateReqInput")
    assert not fields["return_routed_experts"][1] and not fields["routed_experts_start_len"][1]


def test_the_flag_is_sglangs_and_the_launcher_passes_it(sglang_src, tmp_path):
    from spade_async.engines import ROUTES_FLAG, EngineConfig, servers

    assert ROUTES_FLAG in sglang_src.flags()
    cfg = EngineConfig(kind="sglang", gpus=[[0]])
    argv = servers(cfg, "m", tmp_path, routed_experts=True)[0].argv
    assert ROUTES_FLAG in argv
    assert ROUTES_FLAG not in servers(cfg, "m", tmp_path)[0].argv


def test_the_scheduler_refuses_below_zero_and_above_the_prompt(sglang_src):
    """SGLang aborts (HTTP 400) a routed request whose start is < 0 or > the prompt length;
    the CPU engine refuses the same two and accepts 0 and the prompt's length."""
    checks = _sources(_fn(sglang_src, SCHEDULER, "_handle_generate_request"))
    assert "recv_req.routed_experts_start_len < 0" in checks
    assert "recv_req.routed_experts_start_len > len(req.origin_input_ids)" in checks
    from spade_async.generation.server import EngineApp

    app = SimpleNamespace(engine=SimpleNamespace(routed_experts=True))
    prompt = [1, 2, 3, 4]
    for start, ok in [(-1, False), (0, True), (4, True), (5, False)]:
        req = GenerateReqInput(return_routed_experts=True, routed_experts_start_len=start)
        seq = SimpleNamespace(want_routes=False, route_start=0)
        if ok:
            EngineApp._want_routes(app, req, [prompt], [[seq]])
            assert seq.want_routes and seq.route_start == start
        else:
            with pytest.raises(BadRequest, match="routed_experts_start_len"):
                EngineApp._want_routes(app, req, [prompt], [[seq]])


def test_a_reply_covers_start_to_seqlen_minus_one(sglang_src):
    fn = _fn(sglang_src, RESULTS, "_maybe_collect_routed_experts")
    text = _sources(fn)
    assert "len(req.origin_input_ids) + len(req.output_ids_through_stop)" in text
    assert "max(0, seqlen - 1 - start_len)" in text
    get = _sources(_fn(sglang_src, CAPTURER_BASE, "get_topk"))
    assert "req_to_token_pool.req_to_token[req_pool_idx][start_len:seqlen - 1]" in get


def test_layout_dtype_and_base64_are_sglangs(sglang_src):
    """int32 ids, one row per token of num_hidden_layers x num_experts_per_tok, base64 of
    the tensor's bytes, under meta_info["routed_experts"]."""
    base = sglang_src.files[CAPTURER_BASE]
    assert base.count("dtype=torch.int32") >= 2  # device and host buffers
    capturer = _sources(_fn(sglang_src, CAPTURER, "__init__"))
    assert "model_config.hf_text_config.num_experts_per_tok" in capturer
    assert "model_config.hf_text_config.num_hidden_layers" in capturer
    encode = _sources(_fn(sglang_src, DETOKENIZER, "_b64_encode_per_request"))
    assert "pybase64.b64encode(item.numpy().tobytes()).decode('utf-8')" in encode
    assert "routed_experts" in meta_info_stores(sglang_src, HAND_WRITTEN)
    assert reply_problem(sglang_src, routes.GENERATE, "MetaInfo", "routed_experts") is None
    # ours: the same bytes for the same ids (row-major [rows, layers, top-k], little-endian)
    import numpy as np
    import torch

    ids = torch.randint(0, 8, (5, 2, 2), dtype=torch.int32)
    theirs = __import__("base64").b64encode(ids.numpy().tobytes()).decode("utf-8")
    assert encode_sglang(ids.numpy()) == theirs
    back = decode_sglang(theirs, RouteShape(layers=2, topk=2, experts=8), 5)
    assert np.frombuffer(back, np.uint8).reshape(5, 2, 2).tolist() == ids.tolist()


HAND_WRITTEN = "sglang/srt/managers/tokenizer_manager.py"
