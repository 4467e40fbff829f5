"""SGLang 0.5.23's control-plane state machine, as its own source keeps it.

One model, used by the CPU engine (``server.py``), by every fake that stands in for SGLang
in the tests, and by the contract tests that replay what the loop sent. Each rule names
the file and function of the pinned wheel (``sglang_source.PINNED``) it models; paths are
relative to ``sglang/srt/``. Shorthands: ``WU`` = ``managers/scheduler_components/
weight_updater.py`` (``SchedulerWeightUpdaterManager``), ``TM`` =
``managers/tokenizer_manager.py``, ``TCM`` = ``managers/tokenizer_control_mixin.py``,
``SCH`` = ``managers/scheduler.py``, ``HTTP`` = ``entrypoints/http_server.py``.

What it keeps (one ``SGLangState`` per server):

- ``paused``: ``None`` or the ``/pause_generation`` mode (``TM.pause_generation`` sets
  ``is_pause``; ``in_place``/``retract`` also reach ``SCH.pause_generation``, ``abort``
  aborts every request and waits until none is left);
- ``session``: the weight-update session of ``/begin_weight_update`` ..
  ``/end_weight_update`` (``WU._session``); ``update_weights_from_distributed`` and
  ``update_weights_from_tensor`` are refused outside one, ``update_weights_from_disk``
  is not;
- ``offload_tags``: the memory released by ``/release_memory_occupation``
  (``WU.offload_tags``): ``/resume_memory_occupation`` removes each tag it names, or every
  tag of ``GPU_MEMORY_ALL_TYPES`` when it names none, and a tag not in the set raises
  ``KeyError`` in the scheduler, which has no handler around it: the server dies;
- ``weight_version``: what ``/model_info`` reports (``TCM._update_weight_version_if_provided``,
  only after a successful update) and ``served_version``, the weights the scheduler
  generates with (``WU.record_weight_version_after_update``, also when the flush after it
  fails);
- ``groups``: the NCCL groups of ``/init_weights_update_group`` (model runner's
  ``WeightUpdater._model_update_group``).

A call returns a ``Verdict``: accepted, refused (the HTTP status and SGLang's message), or
fatal (SGLang's scheduler raises: the server is gone and every later call fails). More
routes (LoRA adapters, ...) are added as methods and one ``ROUTES`` entry each.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

__all__ = [
    "MEMORY_TAGS",
    "ROUTES",
    "SESSION_ROUTES",
    "HEALTH_GENERATION_ENV",
    "Verdict",
    "Call",
    "SGLangState",
]

# constants.py GPU_MEMORY_ALL_TYPES (order kept): what tags=None means
MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
# environ.py SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION (default True): with it off, HTTP
# health_generate answers /health 200 at once (liveness) instead of generating a token,
# which waits behind a pause and answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s)
HEALTH_GENERATION_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"
# the handlers that refuse outside a weight-update session (WU, "must run between
# begin_weight_update() and end_weight_update()")
SESSION_ROUTES = ("/update_weights_from_distributed", "/update_weights_from_tensor")

_FLUSH_REFUSED = (  # WU.flush_cache_after_weight_update
    "Weights were updated, but the cache was not flushed because requests are still running "
    "or queued. Retract or finish them, then call /flush_cache."
)


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    status: int = 200
    message: str = ""
    fatal: bool = False  # SGLang's scheduler raised: the server is dead

    def body(self) -> dict:
        return {"success": self.ok, "message": self.message}


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """One request as the state machine judged it (the recorder's line)."""

    path: str
    ok: bool
    message: str = ""
    fatal: bool = False


_OK = Verdict(ok=True, message="Success")


class SGLangState:
    """The state of one SGLang server's control plane. ``running()`` returns the requests
    in its running batch (the CPU engine passes its load; fakes set ``running`` by hand)."""

    def __init__(self, weight_version: str = "0", running: Callable[[], int] | None = None):
        self.paused: str | None = None
        self.session: str | None = None  # the selector begin_weight_update recorded
        self.session_loaded = False
        self.offload_tags: set[str] = set()
        self.weight_version = weight_version
        self.served_version = weight_version
        self.groups: set[str] = set()
        self.dead = ""  # why the server died ('' = alive)
        self.calls: list[Call] = []
        self.on_call: Callable[[Call], None] | None = None  # a recorder (server.py trace)
        self._running = running or (lambda: self.running)
        self.running = 0

    # ---- bookkeeping ----------------------------------------------------------------------
    def judge(self, path: str, verdict: Verdict) -> Verdict:
        if self.dead:  # a dead server answers nothing
            verdict = Verdict(ok=False, status=503, message=f"server died: {self.dead}", fatal=True)
        elif verdict.fatal:
            self.dead = f"{path}: {verdict.message}"
        call = Call(path=path, ok=verdict.ok, message=verdict.message, fatal=verdict.fatal)
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)
        return verdict

    def refused(self) -> list[Call]:
        return [c for c in self.calls if not c.ok]

    def _idle(self) -> bool:
        """SCH.is_fully_idle(ignore_waiting=_engine_paused): no running batch. ``retract``
        moved the running requests to the waiting queue, which a paused scheduler ignores;
        ``abort`` left none (TM.pause_generation loops until no request holds the model
        update lock; later ones wait in TM, before the scheduler); ``in_place`` keeps them
        running; unpaused, running and waiting requests both count."""
        if self.paused in ("retract", "abort"):
            return True
        return self._running() == 0

    def _flush_after_update(self, flush_cache: bool) -> Verdict:
        """WU.flush_cache_after_weight_update: a refused flush fails the update. Unpaused,
        TCM takes ``model_update_lock.writer_lock`` first, which waits for every in-flight
        request (TM.update_weights_from_disk, TCM.update_weights_from_distributed/_tensor):
        only a pause leaves requests in the running batch, and only ``in_place`` keeps
        them there."""
        if flush_cache and self.paused == "in_place" and self._running() > 0:
            return Verdict(ok=False, status=400, message=_FLUSH_REFUSED)
        return _OK

    def _weights_resident(self, path: str) -> Verdict | None:
        """Released weights are unmapped by the memory saver (WU.release_memory_occupation
        pauses GPU_MEMORY_TYPE_WEIGHTS; only resume_memory_occupation maps them again):
        loading into them is a device fault in the scheduler."""
        if "weights" in self.offload_tags:
            return Verdict(
                ok=False,
                status=500,
                fatal=True,
                message=f"{path} while the weights are released (illegal memory access); "
                "resume_memory_occupation(tags=['weights']) first",
            )
        return None

    def _updated(self, version: str | None, flush_cache: bool) -> Verdict:
        if version is not None:  # WU.record_weight_version_after_update: the scheduler's
            self.served_version = version
        verdict = self._flush_after_update(flush_cache)
        if verdict.ok and version is not None:  # TCM: /model_info's, on success only
            self.weight_version = version
        return verdict

    # ---- routes ----------------------------------------------------------------------------
    def pause_generation(self, mode: str = "abort") -> Verdict:
        """TM.pause_generation: sets is_pause (no check: pausing twice is fine);
        SCH.pause_generation asserts mode in (in_place, retract) for the modes it gets."""
        if mode not in ("abort", "retract", "in_place"):  # io_struct Literal: HTTP 422
            return Verdict(ok=False, status=422, message=f"mode {mode!r} is not a pause mode")
        self.paused = mode
        return Verdict(ok=True, message="Generation paused successfully.")

    def continue_generation(self) -> Verdict:
        """TM.continue_generation: clears is_pause (no check either)."""
        self.paused = None
        return Verdict(ok=True, message="Generation continued successfully.")

    def begin_weight_update(self, selector: str = "all") -> Verdict:
        """WU.begin_weight_update: refused while a session is open."""
        if self.session is not None:
            return Verdict(
                ok=False,
                status=400,
                message="a weight-update session is already open; call end_weight_update() first",
            )
        self.session, self.session_loaded = selector, False
        return _OK

    def end_weight_update(self) -> Verdict:
        """WU.end_weight_update: refused without an open session."""
        if self.session is None:
            return Verdict(
                ok=False,
                status=400,
                message="no weight-update session is open; call begin_weight_update() first",
            )
        self.session = None
        return _OK

    def init_weights_update_group(self, group_name: str) -> Verdict:
        """model runner WeightUpdater.init_weights_update_group: any non-empty name."""
        if not group_name:
            return Verdict(ok=False, status=500, fatal=True, message="Group name cannot be empty")
        self.groups.add(group_name)
        return Verdict(ok=True, message="Succeeded to initialize custom process group.")

    def destroy_weights_update_group(self, group_name: str) -> Verdict:
        """WeightUpdater.destroy_weights_update_group: refused for an unknown group."""
        if group_name not in self.groups:
            return Verdict(
                ok=False, status=400, message="The group to be destroyed does not exist."
            )
        self.groups.discard(group_name)
        return Verdict(ok=True, message="Succeeded to destroy custom process group.")

    def update_weights_from_disk(
        self, weight_version: str | None, flush_cache: bool = True, loaded: bool = True
    ) -> Verdict:
        """WU.update_weights_from_disk: no session needed; ``loaded`` = the runner loaded
        the checkpoint (else its message is the answer, nothing changes)."""
        fault = self._weights_resident("/update_weights_from_disk")
        if fault is not None:
            return fault
        if not loaded:
            return Verdict(ok=False, status=400, message="Failed to update weights")
        return self._updated(weight_version, flush_cache)

    def update_weights_from_distributed(
        self, group_name: str, weight_version: str | None, flush_cache: bool = True
    ) -> Verdict:
        """WU.update_weights_from_distributed: refused outside a session, before joining
        the broadcast (the trainer's broadcast then waits for a peer that never comes);
        an unknown group fails the receive (WeightUpdater.receive_weights_from_distributed
        asserts, the manager reports it)."""
        if self.session is None:
            return Verdict(
                ok=False,
                status=400,
                message="update_weights_from_distributed must run between "
                "begin_weight_update() and end_weight_update()",
            )
        if group_name not in self.groups:
            return Verdict(
                ok=False,
                status=400,
                message=f"Failed to receive weights: Group {group_name} not in "
                f"{sorted(self.groups)}. Please call `init_weights_update_group` first.",
            )
        fault = self._weights_resident("/update_weights_from_distributed")
        if fault is not None:
            return fault
        self.session_loaded = True
        return self._updated(weight_version, flush_cache)

    def update_weights_from_tensor(
        self, weight_version: str | None, flush_cache: bool = True
    ) -> Verdict:
        """WU.update_weights_from_tensor: refused outside a session."""
        if self.session is None:
            return Verdict(
                ok=False,
                status=400,
                message="update_weights_from_tensor must run between "
                "begin_weight_update() and end_weight_update()",
            )
        fault = self._weights_resident("/update_weights_from_tensor")
        if fault is not None:
            return fault
        self.session_loaded = True
        return self._updated(weight_version, flush_cache)

    def flush_cache(self) -> Verdict:
        """SCH.flush_cache: only when fully idle (HTTP flush_cache answers 400 otherwise)."""
        if not self._idle():
            return Verdict(
                ok=False,
                status=400,
                message="Cache not flushed because there are pending requests.",
            )
        return Verdict(ok=True, message="Cache flushed.")

    def release_memory_occupation(self, tags: list[str] | None) -> Verdict:
        """WU.release_memory_occupation: asserts the server is idle (an AssertionError in
        the scheduler: fatal); None or [] = every type; each tag is added to the offload
        set, unknown ones too (nothing checks them)."""
        if not self._idle():
            return Verdict(
                ok=False,
                status=500,
                fatal=True,
                message="AssertionError: release_memory_occupation should be called only "
                "when server is idle.",
            )
        self.offload_tags |= set(tags or MEMORY_TAGS)
        return _OK

    def resume_memory_occupation(self, tags: list[str] | None) -> Verdict:
        """WU.resume_memory_occupation: None or [] = every type; ``offload_tags.remove``
        each in turn: a tag not released (twice resumed, or never released) raises
        KeyError in the scheduler: fatal."""
        for tag in tags or MEMORY_TAGS:
            if tag not in self.offload_tags:
                return Verdict(
                    ok=False,
                    status=500,
                    fatal=True,
                    message=f"KeyError: {tag!r} (resume_memory_occupation of a tag that is "
                    f"not released; released: {sorted(self.offload_tags)})",
                )
            self.offload_tags.remove(tag)
        return _OK

    def generate(self) -> Verdict:
        """/generate with the KV cache or weights released: nothing to run on."""
        gone = sorted(self.offload_tags & {"kv_cache", "weights"})
        if gone:
            return Verdict(
                ok=False,
                status=409,
                message=f"engine memory is released ({', '.join(gone)}); "
                "POST /resume_memory_occupation first",
            )
        return _OK


# path -> the SGLangState method that judges it (every control route the project sends)
ROUTES: dict[str, str] = {
    "/pause_generation": "pause_generation",
    "/continue_generation": "continue_generation",
    "/begin_weight_update": "begin_weight_update",
    "/end_weight_update": "end_weight_update",
    "/init_weights_update_group": "init_weights_update_group",
    "/destroy_weights_update_group": "destroy_weights_update_group",
    "/update_weights_from_disk": "update_weights_from_disk",
    "/update_weights_from_distributed": "update_weights_from_distributed",
    "/update_weights_from_tensor": "update_weights_from_tensor",
    "/flush_cache": "flush_cache",
    "/release_memory_occupation": "release_memory_occupation",
    "/resume_memory_occupation": "resume_memory_occupation",
}


def apply(state: SGLangState, path: str, body: dict) -> Verdict:
    """Judge one request by its path and JSON body (SGLang's field defaults), recorded."""
    b = body or {}
    flush = bool(b.get("flush_cache", True))
    if path == "/pause_generation":
        v = state.pause_generation(b.get("mode", "abort"))
    elif path == "/continue_generation":
        v = state.continue_generation()
    elif path == "/begin_weight_update":
        v = state.begin_weight_update(b.get("selector", "all"))
    elif path == "/end_weight_update":
        v = state.end_weight_update()
    elif path == "/init_weights_update_group":
        v = state.init_weights_update_group(b.get("group_name", "weight_update_group"))
    elif path == "/destroy_weights_update_group":
        v = state.destroy_weights_update_group(b.get("group_name", "weight_update_group"))
    elif path == "/update_weights_from_disk":
        v = state.update_weights_from_disk(b.get("weight_version"), flush)
    elif path == "/update_weights_from_distributed":
        v = state.update_weights_from_distributed(
            b.get("group_name", "weight_update_group"), b.get("weight_version"), flush
        )
    elif path == "/update_weights_from_tensor":
        v = state.update_weights_from_tensor(b.get("weight_version"), flush)
    elif path == "/flush_cache":
        v = state.flush_cache()
    elif path == "/release_memory_occupation":
        v = state.release_memory_occupation(b.get("tags"))
    elif path == "/resume_memory_occupation":
        v = state.resume_memory_occupation(b.get("tags"))
    elif path == "/generate":
        v = state.generate()
    else:
        v = _OK  # reads (/model_info, /health, ...) change nothing
    return state.judge(path, v)
