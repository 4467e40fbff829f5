"""What a role needs of the run to act, passed as one bundle.

The designer, the hint writer and the agent each generate through the engines' client,
run environment code in the sandbox pool, render chat with the tokenizer and report engine
and pool time to the meters. The loop builds one ``Services`` per run
(``Services.of(runtime)``) and hands it to every call instead of unpacking it into keywords.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spade_async.envs.pool import EnvPool
from spade_async.generation.client import GenerationClient

__all__ = ["Services"]


@dataclass(frozen=True)
class Services:
    client: GenerationClient
    pool: EnvPool
    tokenizer: Any  # a transformers tokenizer with its chat template
    meters: Any = None  # telemetry Meters: engine and env-pool busy time; None: not metered

    @classmethod
    def of(cls, rt: Any) -> Services:
        """The bundle of a loop runtime (anything with ``client``, ``pool``, ``tokenizer``,
        ``meters``)."""
        return cls(rt.client, rt.pool, rt.tokenizer, rt.meters)
