"""Every SGLang HTTP endpoint the project calls: one declared table.

``GenerationClient`` sends each request through an ``Endpoint`` of this table (its path,
method and body struct) and decodes each reply with the endpoint's reply struct; the CPU
engine (``server.py``) serves these same paths and decodes these same structs. The contract
tests (``tests/contract``) check every entry against the pinned SGLang's source: the route
exists with that method, every field of the body struct is a field of SGLang's request
class, every field of the reply struct is one SGLang writes. Paths stay out of other
modules: add an endpoint here and the contract covers it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from spade_async.generation.lora import (
    LoadLoRAAdapterFromTensorsReqInput,
    LoadLoRAAdapterReqInput,
    UnloadLoRAAdapterReqInput,
)
from spade_async.generation.protocol import (
    BeginWeightUpdateReqInput,
    ContinueGenerationReqInput,
    DestroyWeightsUpdateGroupReqInput,
    EndWeightUpdateReqInput,
    GenerateOutput,
    GenerateReqInput,
    InitWeightsUpdateGroupReqInput,
    MemoryOccupationReqInput,
    ModelInfo,
    PauseGenerationReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromTensorReqInput,
    UpdateWeightsReqOutput,
)

__all__ = ["Endpoint", "ENDPOINTS", "by_path"]


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    method: Literal["GET", "POST"]
    request: type | None = None  # body struct (None: no body)
    sglang_request: str | None = None  # SGLang's class for the body, where the names differ
    reply: type | None = None  # reply struct (None: the status code is the answer)


GENERATE = Endpoint(path="/generate", method="POST", request=GenerateReqInput, reply=GenerateOutput)
HEALTH = Endpoint(path="/health", method="GET")
MODEL_INFO = Endpoint(path="/model_info", method="GET", reply=ModelInfo)
# what sglang-router reads to register a worker (model id, context length; spade_async.launch)
SERVER_INFO = Endpoint(path="/server_info", method="GET")
GET_SERVER_INFO = Endpoint(path="/get_server_info", method="GET")
FLUSH_CACHE = Endpoint(path="/flush_cache", method="POST")
PAUSE = Endpoint(path="/pause_generation", method="POST", request=PauseGenerationReqInput)
CONTINUE = Endpoint(path="/continue_generation", method="POST", request=ContinueGenerationReqInput)
RELEASE_MEMORY = Endpoint(
    path="/release_memory_occupation",
    method="POST",
    request=MemoryOccupationReqInput,
    sglang_request="ReleaseMemoryOccupationReqInput",
)
RESUME_MEMORY = Endpoint(
    path="/resume_memory_occupation",
    method="POST",
    request=MemoryOccupationReqInput,
    sglang_request="ResumeMemoryOccupationReqInput",
)
UPDATE_FROM_DISK = Endpoint(
    path="/update_weights_from_disk",
    method="POST",
    request=UpdateWeightFromDiskReqInput,
    reply=UpdateWeightFromDiskReqOutput,
)
# the weight-update session around update_weights_from_distributed/_tensor (SGLang refuses
# both outside one: managers/scheduler_components/weight_updater.py)
BEGIN_UPDATE = Endpoint(
    path="/begin_weight_update",
    method="POST",
    request=BeginWeightUpdateReqInput,
    reply=UpdateWeightsReqOutput,
)
END_UPDATE = Endpoint(
    path="/end_weight_update",
    method="POST",
    request=EndWeightUpdateReqInput,
    reply=UpdateWeightsReqOutput,
)
DESTROY_WEIGHT_GROUP = Endpoint(
    path="/destroy_weights_update_group",
    method="POST",
    request=DestroyWeightsUpdateGroupReqInput,
    reply=UpdateWeightsReqOutput,
)
INIT_WEIGHT_GROUP = Endpoint(
    path="/init_weights_update_group",
    method="POST",
    request=InitWeightsUpdateGroupReqInput,
    reply=UpdateWeightsReqOutput,
)
UPDATE_FROM_DISTRIBUTED = Endpoint(
    path="/update_weights_from_distributed",
    method="POST",
    request=UpdateWeightsFromDistributedReqInput,
    reply=UpdateWeightsReqOutput,
)
UPDATE_FROM_TENSOR = Endpoint(
    path="/update_weights_from_tensor",
    method="POST",
    request=UpdateWeightsFromTensorReqInput,
    reply=UpdateWeightsReqOutput,
)

# LoRA adapters (generation/lora.py). Replies are LoRAUpdateOutput, which SGLang's handlers
# return as a whole struct (tests/contract/test_sglang_lora_contract.py checks its fields).
LOAD_LORA = Endpoint(path="/load_lora_adapter", method="POST", request=LoadLoRAAdapterReqInput)
UNLOAD_LORA = Endpoint(
    path="/unload_lora_adapter", method="POST", request=UnloadLoRAAdapterReqInput
)
LOAD_LORA_FROM_TENSORS = Endpoint(
    path="/load_lora_adapter_from_tensors",
    method="POST",
    request=LoadLoRAAdapterFromTensorsReqInput,
)

ENDPOINTS: tuple[Endpoint, ...] = (
    GENERATE,
    HEALTH,
    MODEL_INFO,
    SERVER_INFO,
    GET_SERVER_INFO,
    FLUSH_CACHE,
    PAUSE,
    CONTINUE,
    RELEASE_MEMORY,
    RESUME_MEMORY,
    UPDATE_FROM_DISK,
    BEGIN_UPDATE,
    END_UPDATE,
    DESTROY_WEIGHT_GROUP,
    INIT_WEIGHT_GROUP,
    UPDATE_FROM_DISTRIBUTED,
    UPDATE_FROM_TENSOR,
    LOAD_LORA,
    UNLOAD_LORA,
    LOAD_LORA_FROM_TENSORS,
)


def by_path(path: str) -> Endpoint:
    for e in ENDPOINTS:
        if e.path == path:
            return e
    raise KeyError(f"{path} is not an endpoint the project uses (see routes.py)")
