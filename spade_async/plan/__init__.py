"""Memory planning for ``spade train RECIPE --dry-run``: what each GPU holds, and whether it fits.

- ``shapes``: a model's shape (from its config.json, or a built-in table for the recipes'
  models when the weights are not on this machine) and exact parameter counts;
- ``gpus``: GPU models by name (``--gpu h100-80gb``) and the one found here (nvidia-smi);
- ``memory``: per-GPU bytes for params, grads, optimizer states, activations at the
  recipe's longest sample and the engines' share; fits / does not fit, and the knob that
  would make it fit.
"""

from spade_async.plan.gpus import GPUS, Gpu, detect_gpu, gpu_by_name
from spade_async.plan.memory import MemoryPlan, format_plan, plan_memory
from spade_async.plan.shapes import ModelShape, model_shape

__all__ = [
    "GPUS",
    "Gpu",
    "detect_gpu",
    "gpu_by_name",
    "MemoryPlan",
    "plan_memory",
    "format_plan",
    "ModelShape",
    "model_shape",
]
