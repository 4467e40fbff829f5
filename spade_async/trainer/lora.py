"""LoRA adapters on the frozen base (``trainer.lora``), with peft, under FSDP2.

peft's ``inject_adapter_in_model`` replaces each targeted ``nn.Linear`` of the Hugging Face
model in place by a ``LoraLayer`` (``<module>.base_layer`` holds the frozen weight,
``<module>.lora_A.default`` / ``lora_B.default`` the adapter, B zero-initialised so step 0
is the base model) and leaves only the adapters trainable. The model keeps its HF layout
(``causal_lm.model.layers``), so PolicyModel, FSDP2's per-block wrapping and the sharded
start-up work unchanged: rank 0 injects the same adapters into its checkpoint copy (seeded),
and the meta model gets them before ``fully_shard``, so the broadcast state dict matches.

Names (``hf_names``): a push/export of the *merged* model writes each adapted weight under
its HF name as W + (alpha / r) B A; ``adapter_state`` gives peft's own adapter file keys
(``base_model.model.<module>.lora_A.weight``) for ``adapter_model.safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from spade_async.errors import ConfigError
from spade_async.generation.lora import adapter_name
from spade_async.trainer.config import LoraConfig
from spade_async.trainer.push_common import (
    ADAPTER,
    PREFIX,
    WeightPushError,
    barrier,
    base_name,
    check_reply,
    lora_pairs,
    replace_dir,
    shm_root,
)

__all__ = [
    "inject",
    "is_adapted",
    "lora_pairs",
    "base_name",
    "adapter_config",
    "ADAPTER_FILE",
    "ADAPTER_CONFIG",
    "adapter_name",
    "push_adapter",
]

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError(
            "trainer.lora needs the 'peft' package (a project dependency): pip install peft"
        ) from None
    return peft


def inject(causal_lm: nn.Module, cfg: LoraConfig, seed: int = 0) -> nn.Module:
    """Adapters on ``causal_lm`` in place (A initialised from ``seed``, B = 0)."""
    peft = _peft()
    present = {name.rsplit(".", 1)[-1] for name, m in causal_lm.named_modules()}
    missing = [m for m in cfg.target_modules if m not in present]
    if missing:
        raise ConfigError(
            f"trainer.lora.target_modules {missing} are not modules of "
            f"{type(causal_lm).__name__}: pick among its linears (q_proj, k_proj, ...)"
        )
    config = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        causal_lm = peft.inject_adapter_in_model(config, causal_lm)
    return causal_lm


def is_adapted(causal_lm: nn.Module) -> bool:
    return hasattr(causal_lm, "peft_config")


def peft_key(name: str) -> str:
    """Our ``<module>.lora_A.default.weight`` -> peft's file key ``base_model.model.<module>.lora_A.weight``."""
    return "base_model.model." + name.replace(f".{ADAPTER}.", ".")


def adapter_config(cfg: LoraConfig, base_model: str) -> dict:
    """peft's adapter_config.json for these adapters (SGLang and peft read it)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model),
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(cfg.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
    }


def write_adapter_config(target: Path, cfg: LoraConfig, base_model: str) -> None:
    (target / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(cfg, base_model), indent=2))


class adapters_off:
    """Context: every LoRA layer of ``module`` computes its base layer only (peft's
    ``disable_adapters`` flag, without touching requires_grad): the initial policy, for
    the KL reference, from the same shards."""

    def __init__(self, module: nn.Module) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]

    def __enter__(self):
        self.saved = [m._disable_adapters for m in self.layers]
        for m in self.layers:
            m._disable_adapters = True
        return self

    def __exit__(self, *exc) -> None:
        for m, s in zip(self.layers, self.saved, strict=True):
            m._disable_adapters = s


def adapter_tensors(trainer, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every rank calls this (the gathers are collective): peft-keyed full adapter tensors
    in ``dtype`` on CPU; the base is not touched."""
    from spade_async.trainer.stream import _full

    out = {}
    for name, p in trainer.model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            out[peft_key(name.removeprefix(PREFIX))] = _full(p, dtype).to("cpu").contiguous()
    return out


def export_adapter(trainer, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Every rank calls this; rank 0 writes peft's adapter directory (adapter_config.json +
    adapter_model.safetensors) atomically: what peft's ``PeftModel.from_pretrained`` and
    SGLang's ``/load_lora_adapter`` read. Default dtype: the checkpoint's."""
    import tempfile

    from safetensors.torch import save_file

    from spade_async.trainer.stream import engine_dtype

    dtype = dtype or engine_dtype(trainer.model_dir, sglang_auto=False)
    target = Path(directory)
    tensors = adapter_tensors(trainer, dtype)
    if trainer.rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
        save_file(tensors, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
        write_adapter_config(tmp, trainer.cfg.lora, str(trainer.model_dir))
        (tmp / "spade_version.json").write_text(json.dumps({"version": trainer.version}))
        replace_dir(tmp, target)
    barrier()
    return target


# ---- adapter-only weight push ------------------------------------------------------------------
def push_adapter(
    trainer,
    engines: list[str],
    *,
    shm_dir: str = "",
    timeout: float = 300.0,
    keep: int = 1,
    dtype: str = "",
    transport=None,
    taken: list[str] | tuple[str, ...] = (),
) -> dict[str, str]:
    """Every rank calls this: export only the adapters (peft format, the engine's dtype) to
    shared memory and ``POST /load_lora_adapter`` them on every engine under a new name,
    ``adapter_name(version)`` (``spade-v{N}.{k}`` when an earlier load of that version is
    still loaded somewhere: ``taken`` names what the caller knows is loaded). Engines read
    the files at load time (SGLang's ``LoRAManager.load_lora_weights``, into CPU memory), so
    only the newest export is kept.

    ``keep >= 0``: the trainer also unloads the adapters it pushed before the ``keep``
    previous ones (SGLang's unload stops new requests on that name at once and returns when
    the in-flight requests using it have finished). ``keep < 0``: it unloads nothing; the run
    loop does (``loop/lora.py``: an adapter is unloaded once no request uses it). Returns
    {engine URL: adapter name} on rank 0."""
    import os
    import shutil

    import httpx

    from spade_async.trainer.stream import engine_dtype

    pushed: list[str] = list(getattr(trainer, "pushed_adapters", []))
    busy = set(taken) | set(pushed)
    again = 0
    while adapter_name(trainer.version, again) in busy:
        again += 1
    name = adapter_name(trainer.version, again)
    root = shm_root(shm_dir) / f"spade-weights-{os.getppid()}"
    target = root / f"lora-{name.removeprefix('spade-')}"
    export_adapter(trainer, target, engine_dtype(trainer.model_dir, dtype, sglang_auto=False))
    if trainer.rank != 0:
        return {}
    with httpx.Client(timeout=timeout, transport=transport) as client:
        for url in engines:
            body = {"lora_name": name, "lora_path": str(target)}
            resp = client.post(f"{url}/load_lora_adapter", json=body)
            if resp.status_code != 200 or not resp.json().get("success"):
                raise WeightPushError(
                    f"engine {url} refused adapter {name} ({resp.status_code}): "
                    f"{resp.json().get('error_message') if resp.content else resp.text}"
                )
        pushed.append(name)
        if keep >= 0:
            old, pushed = pushed[: -1 - keep], pushed[-1 - keep :]
            for n in old:
                for url in engines:
                    check_reply(
                        url, client.post(f"{url}/unload_lora_adapter", json={"lora_name": n})
                    )
        else:
            pushed = [name]
    trainer.pushed_adapters = pushed
    kept = {f"lora-{n.removeprefix('spade-')}" for n in (pushed if keep >= 0 else [name])}
    for d in root.iterdir():  # exports the engines have read already
        if d.name.startswith("lora-v") and d.name not in kept:
            shutil.rmtree(d, ignore_errors=True)
    return {url: name for url in engines}
