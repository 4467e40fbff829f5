"""The LoRA routes, reply fields and launch flags against the pinned SGLang's source.

The routes and their request fields (and /generate's ``lora_path``) are in routes.ENDPOINTS
/ GenerateReqInput, so test_sglang_contract.py checks them; SGLang's LoRA handlers return a
whole ``LoRAUpdateOutput`` struct (no literal keys to read), so its fields are checked here.
"""

from __future__ import annotations

import pytest
from contract_checks import struct_fields

from spade_async.generation import lora, routes


def test_lora_routes_are_in_the_endpoint_table(sglang_src):
    for ep in (routes.LOAD_LORA, routes.UNLOAD_LORA, routes.LOAD_LORA_FROM_TENSORS):
        assert ep in routes.ENDPOINTS
        route = sglang_src.routes()[ep.path]
        assert ep.method in route.methods
        assert route.request == ep.request.__name__
    assert "lora_path" in sglang_src.fields("GenerateReqInput")


@pytest.mark.parametrize("field", struct_fields(lora.LoRAUpdateOutput))
def test_reply_fields_are_sglangs(sglang_src, field):
    assert field in sglang_src.fields("LoRAUpdateOutput"), field


def test_launch_flags_exist(sglang_src):
    args = lora.launch_args(16, ("q_proj", "v_proj"))
    flags = [a for a in args if a.startswith("--")]
    assert flags == ["--enable-lora", "--max-lora-rank", "--lora-target-modules"]
    for f in flags:
        assert f in sglang_src.flags(), f


def test_required_request_fields_are_required_by_sglang_too(sglang_src):
    """What we always send is what SGLang's handlers need: a name (and a path to load)."""
    assert {"lora_name", "lora_path"} <= sglang_src.fields("LoadLoRAAdapterReqInput")
    assert "lora_name" in sglang_src.fields("UnloadLoRAAdapterReqInput")
    assert {"lora_name", "config_dict", "serialized_named_tensors"} <= sglang_src.fields(
        "LoadLoRAAdapterFromTensorsReqInput"
    )
