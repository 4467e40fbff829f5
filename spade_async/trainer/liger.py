"""Liger-Kernel's Triton RMSNorm, RoPE and SwiGLU on the policy's decoder (CUDA only).

``trainer.liger``: ``"auto"`` patches when CUDA, triton and liger-kernel are all there and
the model family is one Liger patches (Qwen3, Qwen3-MoE, Llama: SmolLM2 is a Llama),
otherwise runs plain transformers and logs once what it chose; ``true`` demands it (one
line and exit 2 at start and in --dry-run where it cannot run); ``false`` never patches.

The patch goes on the model instance (``apply_liger_kernel_to_<family>(model=...)``), before
FSDP wraps it: RMSNorm modules (Qwen3's per-head q/k norms included), the rotary embedding
function, the MLPs (Qwen3-MoE: the experts module). Liger's cross-entropy and fused linear
cross-entropy stay off: the policy head computes the loss (kernels/head.py).
Side effect: Liger also rebinds names in transformers' modeling module of that family
(e.g. ``modeling_qwen3.apply_rotary_pos_emb``), process-wide.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from spade_async.errors import ConfigError

__all__ = ["FAMILIES", "apply_liger", "check_liger", "liger_problem"]

log = logging.getLogger(__name__)

# config.model_type -> Liger's patch function
FAMILIES = {
    "qwen3": "apply_liger_kernel_to_qwen3",
    "qwen3_moe": "apply_liger_kernel_to_qwen3_moe",
    "llama": "apply_liger_kernel_to_llama",
}
_logged: set[str] = set()


def liger_problem(on_gpu: bool, model_type: str | None, *, interpret: bool = False) -> str | None:
    """Why Liger cannot run here, or None. ``interpret``: Triton's CPU interpreter (tests)."""
    if not on_gpu and not interpret:
        return "needs trainer GPUs (placement.trainer_gpus is empty)"
    if importlib.util.find_spec("triton") is None:
        return "needs triton (pip install triton)"
    if importlib.util.find_spec("liger_kernel") is None:
        return "needs liger-kernel (pip install liger-kernel)"
    if model_type is not None and model_type not in FAMILIES:
        return f"has no patch for model_type {model_type!r} (Liger patches {sorted(FAMILIES)})"
    return None


def _model_type(model: str) -> str | None:
    cfg = Path(model) / "config.json"
    if not cfg.is_file():
        return None
    import json

    return json.loads(cfg.read_text()).get("model_type")


def check_liger(cfg, on_gpu: bool) -> None:
    """trainer.liger = true where it cannot run: one ConfigError line (exit 2)."""
    if cfg.liger is not True:
        return
    why = liger_problem(on_gpu, _model_type(cfg.model))
    if why:
        raise ConfigError(f"trainer.liger = true but Liger {why}: set trainer.liger = 'auto'")


def apply_liger(causal_lm, setting, on_gpu: bool, *, interpret: bool = False) -> str:
    """Patch ``causal_lm`` in place per ``setting`` ("auto" | True | False); returns what
    ran ("liger: <function>" or "off (<why>)")."""
    if setting is False:
        return "off (trainer.liger = false)"
    model_type = getattr(causal_lm.config, "model_type", None)
    why = liger_problem(on_gpu, model_type, interpret=interpret)
    if why:
        if setting is True:
            raise ConfigError(f"trainer.liger = true but Liger {why}: set trainer.liger = 'auto'")
        choice = f"off ({why})"
    else:
        import liger_kernel.transformers as lt

        name = FAMILIES[model_type]
        getattr(lt, name)(
            rope=True,
            rms_norm=True,
            swiglu=True,
            cross_entropy=False,
            fused_linear_cross_entropy=False,
            model=causal_lm,
        )
        choice = f"liger: {name}"
    if choice not in _logged:  # once per process and choice
        _logged.add(choice)
        log.info("trainer kernels: %s (trainer.liger = %s)", choice, setting)
    return choice
