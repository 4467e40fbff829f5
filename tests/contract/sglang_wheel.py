"""Run pieces of the pinned SGLang wheel's own Python code on CPU.

SGLang's package ``__init__`` and ``sglang.srt.utils`` pull in CUDA-side dependencies
(triton kernels, zmq, sgl_kernel, ...), so the modules the contract tests drive are loaded
one by one from the wheel's files (extracted once into ``$SPADE_CACHE/sglang-src/<ver>``)
under package objects that skip those ``__init__`` files:

- ``sglang.srt.utils.patch_torch`` (SGLang's CUDA-IPC reductions), real source; its only
  import, ``sglang.srt.utils.common``, is a stub with the three names it takes
  (``is_npu``, ``is_musa`` = False, ``torch_release``);
- ``sglang.srt.weight_sync.tensor_bucket`` (``FlattenedTensorBucket``), real source;
- ``MultiprocessingSerializer`` and ``SafeUnpickler`` from ``utils/common.py``: their class
  source is cut out of the wheel's file with ``ast`` and executed (``pybase64`` is the
  standard ``base64``: the two calls they make, ``b64encode`` and ``b64decode(validate=)``,
  have the same signature and result).

``sglang_modules()`` installs them in ``sys.modules`` and removes them (and SGLang's patch
of ``torch.multiprocessing.reductions``) on exit.

``weight_updater_manager()`` builds SGLang's own scheduler-side
``SchedulerWeightUpdaterManager`` (managers/scheduler_components/weight_updater.py: its
class source and ``_WeightUpdateSession``, executed) around a stand-in scheduler, TP worker
and model runner: the request/reply structs it imports from io_struct (which needs zmq,
pydantic and SGLang's scheduler) are plain keyword records, torch's collectives no-ops.
The session, flush and memory-tag logic that runs is SGLang's.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import functools
import importlib.util
import io
import pickle
import sys
import types
import zipfile
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch
from torch.multiprocessing import reductions

from spade_async.generation.sglang_source import PINNED, wheel_path
from spade_async.models import cache_root

FILES = (
    "sglang/srt/managers/scheduler_components/weight_updater.py",
    "sglang/srt/constants.py",
    "sglang/srt/utils/patch_torch.py",
    "sglang/srt/utils/common.py",
    "sglang/srt/weight_sync/tensor_bucket.py",
)


def extracted() -> Path:
    """The wheel's files of ``FILES`` under the cache (extracted once)."""
    root = cache_root() / "sglang-src" / PINNED
    if not all((root / f).is_file() for f in FILES):
        with zipfile.ZipFile(wheel_path()) as z:
            for f in FILES:
                (root / f).parent.mkdir(parents=True, exist_ok=True)
                (root / f).write_bytes(z.read(f))
    return root


def _package(name: str, path: Path) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    return mod


def _load(name: str, file: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _classes_from(file: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """Execute the source of the top-level classes ``names`` of ``file`` in ``namespace``."""
    text = file.read_text()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in names:
            exec(compile(_with_decorators(text, node), str(file), "exec"), namespace)
    return {n: namespace[n] for n in names}


def _with_decorators(text: str, node: ast.AST) -> str:
    first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    return "\n".join(text.splitlines()[first - 1 : node.end_lineno])


_SAVED = ("reduce_tensor", "rebuild_cuda_tensor")


@contextlib.contextmanager
def sglang_modules():
    root = extracted()
    srt = root / "sglang" / "srt"
    before = {k for k in sys.modules if k == "sglang" or k.startswith("sglang.")}
    assert not before, f"a real sglang is imported here: {sorted(before)}"
    saved = {k: getattr(reductions, k) for k in _SAVED}
    common = types.ModuleType("sglang.srt.utils.common")
    common.is_npu = common.is_musa = lambda: False
    common.torch_release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    mods = {
        "sglang": _package("sglang", root / "sglang"),
        "sglang.srt": _package("sglang.srt", srt),
        "sglang.srt.utils": _package("sglang.srt.utils", srt / "utils"),
        "sglang.srt.weight_sync": _package("sglang.srt.weight_sync", srt / "weight_sync"),
        "sglang.srt.utils.common": common,
    }
    sys.modules.update(mods)
    try:
        ns = {"io": io, "pickle": pickle, "ForkingPickler": ForkingPickler, "pybase64": base64,
              "_safe_load_torch_storage": None}  # fmt: skip
        found = _classes_from(srt / "utils" / "common.py", ("MultiprocessingSerializer",
                                                           "SafeUnpickler"), ns)  # fmt: skip
        for name, cls in found.items():
            setattr(mods["sglang.srt.utils"], name, cls)
        out = types.SimpleNamespace(
            patch_torch=_load("sglang.srt.utils.patch_torch", srt / "utils" / "patch_torch.py"),
            tensor_bucket=_load(
                "sglang.srt.weight_sync.tensor_bucket", srt / "weight_sync" / "tensor_bucket.py"
            ),
            **found,
        )
        yield out
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        for k, v in saved.items():
            setattr(reductions, k, v)
        for k in ("_reduce_tensor_original", "_rebuild_cuda_tensor_original"):
            if hasattr(reductions, k):
                delattr(reductions, k)
        reductions.init_reductions()


class _Record:
    """An io_struct request/reply stand-in: keyword fields, SGLang's defaults given."""

    def __init__(self, **kw) -> None:
        self.__dict__.update(kw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"


class StandIn:
    """Scheduler, TP worker and model runner for SGLang's manager: every runner call
    succeeds (the model side is not what is checked), each is recorded."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.running = 0  # requests in the running batch
        self._engine_paused = False
        self.disaggregation_mode = "null"
        self.weight_version = None
        self.model_runner = types.SimpleNamespace(
            weight_updater=self, model=types.SimpleNamespace(named_buffers=lambda: [])
        )

    # tp_worker
    def weight_update_runners(self):
        return [("target", types.SimpleNamespace(weight_updater=self))]

    def deserialize_own_rank(self, payloads):
        return payloads[0]

    def init_weights_update_group(self, req):
        return True, "ok"

    def destroy_weights_update_group(self, req):
        return True, "ok"

    # runner weight updater
    def begin_weight_update(self):
        self.calls.append("runner.begin")

    def end_weight_update(self, *, run_post_load):
        self.calls.append(f"runner.end(post_load={run_post_load})")

    def receive_weights_from_distributed(self, **kw):
        return []

    def load_weights_from_distributed(self, weights):
        return True, "loaded"

    def update_weights_from_tensor(self, **kw):
        return True, "loaded"

    def update_weights_from_disk(self, *a, **kw):
        return True, "loaded"

    # scheduler
    def record_weight_version_change(self, new_version):
        if new_version is not None:
            self.weight_version = new_version

    def flush_cache(self, empty_cache: bool = True) -> bool:
        return self.running == 0

    def is_fully_idle(self, ignore_waiting: bool = False) -> bool:
        return self.running == 0

    # memory saver
    def pause(self, tag):
        self.calls.append(f"saver.pause({tag})")

    def resume(self, tag):
        self.calls.append(f"saver.resume({tag})")


def weight_updater_manager(stand_in: StandIn):
    """SGLang 0.5.23's ``SchedulerWeightUpdaterManager`` around ``stand_in``."""
    cls, ns = _manager_class()
    return cls(
        tp_worker=stand_in,
        draft_worker=None,
        memory_saver_adapter=stand_in,
        flush_cache=stand_in.flush_cache,
        is_fully_idle=stand_in.is_fully_idle,
        scheduler=stand_in,
    ), ns


@functools.cache
def _manager_class():
    import dataclasses
    import typing

    import msgspec

    root = extracted()
    file = root / "sglang/srt/managers/scheduler_components/weight_updater.py"
    consts: dict = {}
    exec((root / "sglang/srt/constants.py").read_text(), consts)
    parallel = types.SimpleNamespace(tp_group=types.SimpleNamespace(cpu_group=None))
    fake_torch = types.SimpleNamespace(
        distributed=types.SimpleNamespace(barrier=lambda *a, **k: None),
        get_device_module=lambda: types.SimpleNamespace(synchronize=lambda: None),
        inference_mode=contextlib.nullcontext,
    )
    ns = {
        **{k: getattr(typing, k) for k in ("Any", "Callable", "Dict", "Iterator", "List",
                                           "Optional", "Set", "Tuple")},  # fmt: skip
        **{k: v for k, v in consts.items() if k.startswith("GPU_MEMORY")},
        "__name__": "sglang_wheel_weight_updater", "msgspec": msgspec, "torch": fake_torch, "time": __import__("time"),
        "contextmanager": contextlib.contextmanager, "dataclass": dataclasses.dataclass,
        "field": dataclasses.field, "logger": __import__("logging").getLogger("sglang-wheel"),
        "traceback": __import__("traceback"), "get_parallel": lambda: parallel,
        "get_model": lambda: types.SimpleNamespace(weight_cache_mode="off"),
        "DisaggregationMode": types.SimpleNamespace(DECODE="decode", PREFILL="prefill"),
        "_export_static_state": lambda model: {"buffers": []},
        "_import_static_state": lambda model, state: None,
        "overall_checksum": lambda x: "",
    }  # fmt: skip
    module = types.ModuleType(ns["__name__"])  # dataclass resolves string annotations there
    module.__dict__.update(ns)
    sys.modules[module.__name__] = module
    ns = module.__dict__
    text = file.read_text()
    tree = ast.parse(text)
    for node in tree.body:  # every io_struct name it imports: a keyword record
        if isinstance(node, ast.ImportFrom) and node.module == "sglang.srt.managers.io_struct":
            for alias in node.names:
                ns[alias.name] = type(alias.name, (_Record,), {})
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            if node.name in ("_WeightUpdateSession", "SchedulerWeightUpdaterManager",
                             "_parse_runner_selector"):  # fmt: skip
                exec(compile(_with_decorators(text, node), str(file), "exec"), ns)
    return ns["SchedulerWeightUpdaterManager"], ns


def request(ns: dict, cls: str, **fields):
    """An io_struct request with SGLang's field defaults (from weight_updater's view: the
    manager reads ``recv_req.<field>``)."""
    defaults = {"flush_cache": True, "torch_empty_cache": False, "selector": "all",
                "weight_version": None, "load_format": None, "tags": None,
                "group_name": "weight_update_group", "recapture_cuda_graph": False}  # fmt: skip
    return ns[cls](**{**defaults, **fields})
