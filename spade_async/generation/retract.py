"""SGLang's ``pause_generation(mode="retract")`` in the CPU engine.

SGLang 0.5.23 (``managers/scheduler.py``, ``pause_generation``): the running requests
(and a prefill in flight) are retracted with ``retract_all``: their KV is freed and they go
back to the waiting queue, which a paused scheduler ignores. A weight update while paused
then flushes the cache (``flush_cache`` after the update); on ``/continue_generation`` each
retracted request is prefilled again over its prompt and the tokens it had generated,
under the weights now loaded ("its KV is rebuilt under the new weights"), and decodes on.
Its routed experts come from that re-prefill: SGLang's capturer keeps the routes of the KV
slots a request holds, so the rows of every recomputed position are the re-prefill's, also
for the tokens sampled under the old weights.

Here ``retract_running`` does the same on the scheduler thread: the running rows leave the
batch (their KV with it), go to the front of the waiting queue in their order, and
``Engine._prefill`` later recomputes ``Sequence.context()`` (prompt + output so far) from
position 0; ``route_capture.keep`` appends that forward's rows, which overwrite the earlier
chunks of those positions (``route_capture.assemble``: a later chunk wins). A swap while
paused records each retracted request's tokens so far in its ``version_events``
(``Engine._do_swap`` counts waiting requests with output), so the reply's
``weight_versions`` spans show the update.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from spade_async.generation.priority import waiting_order

__all__ = ["retract_running"]


def retract_running(engine: Any) -> int:
    """Move ``engine``'s running rows back to its waiting queue (scheduler thread only);
    returns how many were retracted."""
    seqs = list(engine.active)
    if not seqs:
        return 0
    engine._reset_batch()  # their KV is gone
    with engine._cond:
        pending = deque([*seqs, *engine._pending])
        if engine.priority.enabled:
            pending = deque(waiting_order(pending, engine.priority.sign))
        engine._pending = pending
    engine.stats["retractions"] = engine.stats.get("retractions", 0) + len(seqs)
    return len(seqs)
