"""The weight routes of the generation client: versions, and the three ways weights arrive.

``GenerationClient`` (``client.py``) takes these as a mixin; they only need its ``urls`` and
its one request path (``_call``, ``_fan_out``). Every engine gets the same update at once
and the reply is every engine's weight version afterwards (``GET /model_info``).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import msgspec

from spade_async.generation import routes
from spade_async.generation.engine_errors import EngineError, decode_reply, raise_all
from spade_async.generation.protocol import (
    ModelInfo,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromTensorReqInput,
)
from spade_async.generation.routes import Endpoint

__all__ = ["WeightRoutes"]


class WeightRoutes:
    """Mixin: needs ``self.urls``, ``self._call(url, ep, req)`` and ``self._fan_out(calls)``."""

    urls: list[str]

    async def weight_versions(self) -> dict[str, str | None]:
        """Each engine's current weight version (``GET /model_info``; SGLang 0.5.23 serves no
        ``/get_weight_version``)."""
        out: dict[str, str | None] = {}
        decoder = msgspec.json.Decoder(ModelInfo)

        errors: list[EngineError] = []

        async def one(url: str) -> None:
            try:
                body = await self._call(url, routes.MODEL_INFO, None)
                out[url] = decode_reply(decoder, body, url, routes.MODEL_INFO).weight_version
                if out[url] is not None and hasattr(self, "saw_version"):
                    self.saw_version(url, out[url])  # routing replay: engine_version
            except EngineError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for url in self.urls:
                tg.start_soon(one, url)
        raise_all(errors)
        return out

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
    ) -> dict[str, str | None]:
        """``flush_cache=False`` while paused ``in_place`` with requests running: SGLang
        refuses the flush then, and reports the whole update as failed."""
        req = UpdateWeightFromDiskReqInput(
            model_path=model_path,
            weight_version=weight_version,
            abort_all_requests=abort_all_requests,
            flush_cache=flush_cache,
        )
        return await self._update(routes.UPDATE_FROM_DISK, req)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        *,
        ranks_per_engine: Sequence[int] | None = None,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
    ) -> None:
        """Join every engine to the trainer's NCCL group: trainer is rank 0, engine i's TP
        ranks follow (``rank_offset`` = 1 + ranks of the engines before it)."""
        from spade_async.generation.protocol import weight_group_requests

        ranks = list(ranks_per_engine or [1] * len(self.urls))
        if len(ranks) != len(self.urls):
            raise ValueError(
                f"ranks_per_engine has {len(ranks)} entries for {len(self.urls)} engines"
            )
        reqs = weight_group_requests(
            ranks, master_address, master_port, group_name=group_name, backend=backend
        )
        await self._fan_out(
            [(url, routes.INIT_WEIGHT_GROUP, req) for url, req in zip(self.urls, reqs, strict=True)]
        )

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        *,
        group_name: str = "weight_update_group",
        weight_version: str | None = None,
        flush_cache: bool = True,
    ) -> dict[str, str | None]:
        req = UpdateWeightsFromDistributedReqInput(
            names=names,
            dtypes=dtypes,
            shapes=shapes,
            group_name=group_name,
            weight_version=weight_version,
            flush_cache=flush_cache,
        )
        return await self._update(routes.UPDATE_FROM_DISTRIBUTED, req)

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: list[str],
        *,
        load_format: str | None = None,
        weight_version: str | None = None,
        flush_cache: bool = True,
    ) -> dict[str, str | None]:
        req = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=serialized_named_tensors,
            load_format=load_format,
            weight_version=weight_version,
            flush_cache=flush_cache,
        )
        return await self._update(routes.UPDATE_FROM_TENSOR, req)

    async def _update(self, ep: Endpoint, req: msgspec.Struct) -> dict[str, str | None]:
        await self._fan_out([(url, ep, req) for url in self.urls])
        return await self.weight_versions()
