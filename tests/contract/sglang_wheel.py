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
"""

from __future__ import annotations

import ast
import base64
import contextlib
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
            exec(compile(ast.get_source_segment(text, node), str(file), "exec"), namespace)
    return {n: namespace[n] for n in names}


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
