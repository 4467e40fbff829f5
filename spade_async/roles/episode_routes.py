"""An episode's MoE routes, turn by turn, kept right across weight updates (routing replay).

Each turn's request asks SGLang for the routes of the positions it adds
(``routed_experts_start_len`` = the rows the episode already has) and brings rows up to its
last token but one. That is right while every turn's prefill reuses the KV the earlier
turns' rows came from. A weight update breaks it: with ``pause_mode = "retract"`` or
``"abort"`` the update flushes the KV cache, so the next turn's prefill recomputes the whole
context under the new weights, and the rows stored for the earlier turns no longer describe
what the new turn was sampled with. A request retracted mid-generation is re-prefilled, and
SGLang returns the re-prefill's rows for tokens sampled under the old weights.

So the rows live in *epochs*: turns whose rows all describe their sampling.

- Before a turn: when the engine the session is pinned to reports weights other than the
  ones that computed the stored rows (``GenerationClient.engine_version``: the newest
  version its replies and ``/model_info`` showed), the epoch closes and the turn asks for
  its routes from position 0: SGLang returns the rows its KV holds for the whole context,
  recomputed or cached, which are the rows this turn is sampled with.
- After a turn: when its reply shows an update the client did not know of (its oldest
  weights differ from the stored rows' weights, or it ran across an update:
  ``weight_versions`` spans), its rows do not describe its sampling; the turn is an epoch
  of its own *without* routes (trained without replay, counted: ``stale``) and the next
  turn asks from 0.

``loop/batcher.py`` gives each epoch's turns the epoch's rows (one trainer sample per epoch
when an episode has several; one unit of the loss, as thinking fan-out's turn samples).
"""

from __future__ import annotations

from typing import Any

__all__ = ["EpisodeRoutes"]


class EpisodeRoutes:
    """The routes of one episode (see the module docstring)."""

    def __init__(self, client: Any, session_key: str | None = None) -> None:
        self.client, self.key = client, session_key
        self.on = getattr(client, "route_shape", None) is not None
        self.data, self.rows, self.status = bytearray(), 0, ""
        self.version: str | None = None  # the weights that computed the rows in data
        self.first = 0  # first turn of the open epoch
        self.turn = 0  # turns added so far
        self.epochs: list[tuple[int, int, bytes]] = []  # closed: (first turn, end turn, rows)
        self.stale = 0  # turns trained without replay

    def start(self) -> int:
        """``routes_from`` of the next turn: the rows held, or 0 after the engine's weights
        moved (the epoch closes; the turn asks for the whole context's rows)."""
        if not self.on or self.status or not self.rows:
            return self.rows
        seen = getattr(self.client, "engine_version", lambda _key: None)(self.key)
        if seen is not None and self.version is not None and seen != self.version:
            self._close()
        return self.rows

    def add(self, res: Any, prompt_len: int) -> None:
        """Take one turn's reply (its prompt was ``prompt_len`` tokens)."""
        turn, self.turn = self.turn, self.turn + 1
        if not self.on or self.status:
            return
        if res.routes_problem or res.routed_experts is None:
            self.status = res.routes_problem or "missing"
            return
        oldest = res.policy_version if res.policy_version is not None else res.weight_version
        across = oldest != res.weight_version  # an update landed while it ran
        moved = self.rows > 0 and oldest != self.version  # its prefix's rows predate it
        if across or moved:
            self._close(upto=turn)
            self.epochs.append((turn, turn + 1, b""))  # trained without replay
            self.first, self.stale = turn + 1, self.stale + 1
            return
        self.data += res.routed_experts
        self.rows = max(self.rows, prompt_len + len(res.output_ids) - 1)
        self.version = res.weight_version

    def _close(self, upto: int | None = None) -> None:
        end = self.turn if upto is None else upto
        if end > self.first:
            self.epochs.append((self.first, end, bytes(self.data)))
        self.first, self.data, self.rows, self.version = end, bytearray(), 0, None

    def finish(self) -> tuple[bytes, list[tuple[int, int, bytes]]]:
        """(``Episode.routed_experts``, ``Episode.route_epochs``): one epoch -> its rows and
        no epochs (as before any update); several -> every epoch, the last one's rows."""
        if not self.epochs:
            return bytes(self.data), []
        if self.turn > self.first:
            self.epochs.append((self.first, self.turn, bytes(self.data)))
            self.first = self.turn
        return self.epochs[-1][2], list(self.epochs)
