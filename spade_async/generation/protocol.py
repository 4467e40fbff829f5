"""Wire structs for the subset of SGLang's native HTTP API the project uses.

Matched against the pinned SGLang 0.5.23 (``sglang/srt/managers/io_struct.py``,
``sglang/api/v1/api_types.py``, ``sglang/srt/entrypoints/http_server.py``; every field is
checked against that source by ``tests/contract``, the paths live in ``routes.py``): ``GenerateReqInput``,
``SamplingParams``, ``UpdateWeightFromDiskReqInput``/``Output``,
``InitWeightsUpdateGroupReqInput``, ``UpdateWeightsFromDistributedReqInput``,
``UpdateWeightsFromTensorReqInput``. Field names and defaults follow SGLang; only the
fields the project sends are declared. The CPU engine (``server.py``) decodes requests with
these structs and rejects unknown fields (HTTP 400 naming the field) rather than silently
ignoring a sampling option it does not implement. The client encodes with the same structs
(``omit_defaults``), so what it sends is valid for real SGLang too.

One response per prompt (a list for a batch)::

    {"text": str, "output_ids": [int],
     "meta_info": {"id": rid, "prompt_tokens": int, "completion_tokens": int,
                   "finish_reason": {"type": "stop"|"length"|"abort", "matched": int|str|None},
                   "weight_version": str,
                   "output_token_logprobs": [[logprob, token_id, text_or_null], ...],
                   "routed_experts": base64 (MoE, when asked: routed_experts.py)}}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

__all__ = [
    "BadRequest",
    "SamplingParams",
    "GenerateReqInput",
    "FinishReason",
    "MetaInfo",
    "GenerateOutput",
    "UpdateWeightFromDiskReqInput",
    "UpdateWeightsReqOutput",
    "UpdateWeightFromDiskReqOutput",
    "WeightVersionSpan",
    "PauseGenerationReqInput",
    "ContinueGenerationReqInput",
    "InitWeightsUpdateGroupReqInput",
    "UpdateWeightsFromDistributedReqInput",
    "UpdateWeightsFromTensorReqInput",
    "MemoryOccupationReqInput",
    "ModelInfo",
    "ErrorBody",
]


class BadRequest(Exception):
    """A request the CPU engine's server refuses with 400 (one line: what is wrong)."""


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """SGLang ``SamplingParams`` subset (same names and defaults)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class GenerateReqInput(
    msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """``POST /generate``. ``input_ids`` is one prompt (list of ints) or a batch (list of lists)."""

    input_ids: list[int | list[int]] | None = None
    text: str | list[str] | None = None
    sampling_params: SamplingParams | list[SamplingParams] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    lora_path: str | list[str | None] | None = None  # the loaded adapter's name (or per prompt)
    # the waiting queue's order when the server runs --enable-priority-scheduling (one value
    # for every prompt of the request, as SGLang's batch split copies it)
    priority: int | None = None
    # MoE routing replay (routed_experts.py): the top-k experts of every token from
    # ``routed_experts_start_len`` (0..prompt length; the server needs
    # --enable-return-routed-experts) to the last one before the final sampled token
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    # Fields sglang-router (0.3.x) adds when it forwards a request (SGLang's own names);
    # accepted so the CPU engine can sit behind the router. The server rejects the ones it
    # cannot honour. (The router's OpenAI-style ``model`` is in the server's own struct.)
    log_metrics: bool = True
    no_logs: bool = False
    background: bool = False
    return_hidden_states: bool = False
    return_bytes: bool = False
    return_entropy: bool = False


class FinishReason(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None


class WeightVersionSpan(msgspec.Struct, kw_only=True):
    """Output tokens ``[start, end)`` were generated with weights ``version`` (SGLang writes
    these when a weight update lands while the request runs, e.g. paused ``in_place``)."""

    version: str
    start: int
    end: int


class MetaInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason | None
    weight_version: str = "default"  # the weights of the last generated token
    weight_versions: list[WeightVersionSpan] | None = None  # per token span, oldest first
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    # base64 int32 [rows, layers, top_k] (routed_experts.py); SGLang's tokenizer manager
    # writes it by hand (the typed v1 GenerateMetaInfo lacks it)
    routed_experts: str | None = None

    def oldest_version(self) -> str:
        """The oldest weights any output token was generated with (the turn's policy)."""
        return self.weight_versions[0].version if self.weight_versions else self.weight_version


class GenerateOutput(msgspec.Struct, kw_only=True):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class MemoryOccupationReqInput(msgspec.Struct, kw_only=True):
    """Body of ``/release_memory_occupation`` and ``/resume_memory_occupation`` (SGLang's
    Release/ResumeMemoryOccupationReqInput): the regions, or null for all."""

    tags: list[str] | None = None


class UpdateWeightFromDiskReqInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class UpdateWeightsReqOutput(msgspec.Struct, kw_only=True):
    """Reply of the weight-update endpoints (and ``/init_weights_update_group``)."""

    success: bool
    message: str = ""


class UpdateWeightFromDiskReqOutput(UpdateWeightsReqOutput, kw_only=True):
    """Reply of ``/update_weights_from_disk``: also how many requests it paused."""

    num_paused_requests: int = 0


class PauseGenerationReqInput(msgspec.Struct, kw_only=True):
    """``POST /pause_generation``. ``abort`` ends running requests; ``retract`` puts them back
    in the queue and allows ``/flush_cache`` (their KV cache is recomputed on continue);
    ``in_place`` keeps them and their KV cache (a flush then fails)."""

    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueGenerationReqInput(msgspec.Struct, kw_only=True):
    """``POST /continue_generation`` (no field sent: SGLang's defaults)."""


class BeginWeightUpdateReqInput(msgspec.Struct, kw_only=True):
    """``POST /begin_weight_update``: opens the weight-update session that
    ``update_weights_from_distributed``/``_tensor`` need (SGLang refuses them outside one)."""

    selector: Literal["target", "draft", "all"] = "all"


class EndWeightUpdateReqInput(msgspec.Struct, kw_only=True):
    """``POST /end_weight_update`` (no field): closes the session."""


class DestroyWeightsUpdateGroupReqInput(msgspec.Struct, kw_only=True):
    """``POST /destroy_weights_update_group``: drops an NCCL weight group by name."""

    group_name: str = "weight_update_group"


class InitWeightsUpdateGroupReqInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateWeightsFromDistributedReqInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None  # "flattened_bucket": one uint8 broadcast per bucket


class UpdateWeightsFromTensorReqInput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``serialized_named_tensors``: one entry per TP rank, as SGLang's
    ``MultiprocessingSerializer`` produced them (base64 strings over HTTP)."""

    serialized_named_tensors: list[str]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class ModelInfo(msgspec.Struct, kw_only=True):
    """``GET /model_info`` (extra keys SGLang sends are ignored when decoding)."""

    model_path: str
    tokenizer_path: str | None = None
    is_generation: bool = True
    weight_version: str | None = None


class ErrorBody(msgspec.Struct):
    error: dict[str, Any]


def weight_group_requests(
    tp_sizes: Sequence[int],
    master_address: str,
    master_port: int,
    *,
    group_name: str = "weight_update_group",
    backend: str = "nccl",
) -> list[InitWeightsUpdateGroupReqInput]:
    """One ``/init_weights_update_group`` body per engine: trainer rank 0, engines after it."""
    world = 1 + sum(tp_sizes)
    offsets = [1 + sum(tp_sizes[:i]) for i in range(len(tp_sizes))]
    return [
        InitWeightsUpdateGroupReqInput(
            master_address=master_address,
            master_port=master_port,
            rank_offset=off,
            world_size=world,
            group_name=group_name,
            backend=backend,
        )
        for off in offsets
    ]
