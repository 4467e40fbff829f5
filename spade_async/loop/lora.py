"""The run loop under LoRA serving (``trainer.lora`` set): engines serve the frozen base plus
one adapter per pushed policy version.

How a run serves adapters:

- Engines start from the *base* model (never the run's merged ``hf/`` export) with weight
  version 0 and SGLang's ``--enable-lora --max-lora-rank R --lora-target-modules ...``
  (``engines.servers``; the CPU engine takes the same flags).
- Each push is mode ``lora`` (``trainer/lora.py::push_adapter``): the trainer exports only the
  adapter and loads it on every engine under a new name, ``spade-v{N}`` (``spade-v{N}.{k}``
  when that version is pushed again after a trainer or engine restart: SGLang refuses a
  second load of a loaded name). Only then does the generation client switch to it.
- The current adapter lives in the generation client (``GenerationClient.set_adapter``):
  every request names it as ``lora_path``, chosen once when the request starts (retries keep
  it), so a request started under v3 finishes on v3 even if v4 loads meanwhile (SGLang pins
  a request's adapter too). Before the first push requests name no adapter: the base,
  policy version 0.

The policy version of a turn is the version of the adapter its request ran on (``spade-vN``
-> N; the base -> 0), never ``meta_info.weight_version``: SGLang does not bump that on an
adapter load. An episode's version is the oldest over its turns (``Episode.version``), as
with full weights, so ``max_staleness``, ``batch/versions`` and ``batch/max_agent_age`` count
adapter versions.

The rule for multi-turn episodes: **every request (every turn) runs on the newest adapter
loaded when it starts**; a later turn of an episode started under v3 moves to v5 if v5 is
current, and the episode's policy version stays 3 (the oldest of its turns). No turn ever
names an adapter that may be gone.

Unloading: after each push, every adapter other than the current one that no request of
this client uses any more (``GenerationClient.adapter_load``) is unloaded on the engines that
hold it; one still in use is retried at the next push. SGLang's ``/unload_lora_adapter``
would also wait for in-flight requests, but gating on the client's own count means no
request is ever refused its adapter and no unload blocks the loop; so there is no ``keep``
to tune against ``max_staleness``: an adapter stays exactly as long as a request needs it
(the async schedule's in-flight groups are what bound how many are loaded at once).

Restarts: a crashed engine comes back knowing no adapters (``forget``); the push that
``engine_restarted`` makes loads the current version under a fresh name on every engine
before the engine rejoins the rotation. A restarted trainer's push does the same. A
resumed run's engines start from the base, and the checkpoint's adapter is pushed before
any generation (``open_runtime``), so a resumed run never serves the base while claiming
version N.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spade_async.generation.lora import adapter_version

if TYPE_CHECKING:
    from spade_async.generation.client import GenerationClient

__all__ = ["AdapterBook"]


@dataclass
class AdapterBook:
    """Which adapters each engine holds, as this controller loaded them."""

    urls: list[str]
    loaded: dict[str, list[str]] = field(default_factory=dict)  # engine URL -> names, oldest first
    unloaded: list[str] = field(default_factory=list)  # every name unloaded so far (metrics, tests)

    def taken(self) -> list[str]:
        """Every name some engine holds (a new load must avoid them)."""
        return sorted({n for names in self.loaded.values() for n in names})

    def pushed(self, engines: dict[str, str]) -> str:
        """Record a push's reply {URL: name}; returns the name."""
        names = set(engines.values())
        if len(names) != 1:
            raise ValueError(f"an adapter push loaded different names on the engines: {engines}")
        name = names.pop()
        adapter_version(name)  # one of ours, or ValueError
        for url in self.urls:
            self.loaded.setdefault(url, []).append(name)
        return name

    def forget(self, url: str) -> None:
        """A restarted engine holds no adapters."""
        self.loaded[url.rstrip("/")] = []

    async def retire(self, client: GenerationClient) -> list[str]:
        """Unload, on each engine holding it, every adapter but the client's current one that
        no request of the client still uses; returns the names unloaded."""
        busy = set(client.adapter_load())
        current = client.adapter
        done = []
        for name in self.taken():
            if name == current or name in busy:
                continue
            holders = [u for u, names in self.loaded.items() if name in names]
            await client.unload_adapter(name, holders)
            for u in holders:
                self.loaded[u].remove(name)
            done.append(name)
        self.unloaded += done
        return done
