"""SGLang part: the engine-side pause / update / resume needs a running SGLang server.

SGLang's CUDA packages do not fit the 64 MiB the GPU machine carries (docs/gpu-check.md), so
this part reports ``skipped`` when SGLang does not import. Where it does import, driving a
real server is not prepared in this script: the part says so (ok: false) rather than
pretending; the adapters stay covered by the CPU contract tests of the documented API.
"""

from __future__ import annotations

import importlib.util


def sglang_part(ctx: dict, result: dict) -> None:
    if importlib.util.find_spec("sglang") is None:
        result["skipped"] = "sglang not installed"
        result["ok"] = True
        return
    import sglang

    result["sglang"] = getattr(sglang, "__version__", "?")
    result["ok"] = False
    result["error"] = (
        "sglang imports, but launching a server and timing pause/update/resume is not "
        "implemented in gpu_check.py"
    )
