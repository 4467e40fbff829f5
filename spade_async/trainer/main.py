"""Trainer rank entry point: ``torchrun --nproc-per-node N -m spade_async.trainer.main ...``.

Initialises the process group (gloo on CPU, nccl on GPU, plus a gloo group for control
messages), builds the Trainer, then rank 0 serves the RPC socket and the other ranks follow
the commands it broadcasts. Started by ``launch.TrainerProcess``; runnable by hand too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import msgspec
import torch
import torch.distributed as dist

from spade_async.failure import run_recorded
from spade_async.trainer import rpc
from spade_async.trainer.checkpoint import export_hf, load_checkpoint, save_checkpoint
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.step import Trainer
from spade_async.trainer.weights import push_weights


def backend(cuda: bool, offload: str = "none") -> str:
    """The process group's backend. With optimizer offload on GPU the sharded gradients live
    on the host, so the gradient norm's all-reduce runs on CPU tensors: gloo for CPU
    tensors, NCCL for CUDA ones (FSDP2's CPU-offload recipe)."""
    if not cuda:
        return "gloo"
    return "cpu:gloo,cuda:nccl" if offload == "optimizer" else "nccl"


def _setup(offload: str = "none") -> tuple[torch.device, object]:
    cuda = torch.cuda.is_available()
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend(cuda, offload), timeout=timedelta(minutes=30))
    control = dist.new_group(backend="gloo") if cuda else None
    return device, control


def make_executor(trainer: Trainer):
    def execute(req: rpc.Request) -> rpc.Reply:
        if isinstance(req, rpc.TrainStep):
            return rpc.StepDone(
                metrics=trainer.train_step(req.batch, validated=True, layout=req.layout)
            )
        if isinstance(req, rpc.PushWeights):
            t0, stats = time.perf_counter(), {}
            versions = push_weights(trainer, req, stats)
            return rpc.WeightsPushed(
                version=trainer.version,
                engines=versions,
                seconds=time.perf_counter() - t0,
                paused_s=stats.get("paused_s", 0.0),
            )
        if isinstance(req, rpc.Save):
            save_checkpoint(trainer, req.directory)
            if req.hf_directory:
                export_hf(trainer, req.hf_directory)
            return rpc.Saved(directory=req.directory, version=trainer.version)
        if isinstance(req, rpc.ExportHF):
            export_hf(trainer, req.directory)
            return rpc.Saved(directory=req.directory, version=trainer.version)
        if isinstance(req, rpc.Load):
            load_checkpoint(trainer, req.directory)
            return rpc.Loaded(step=trainer.step, version=trainer.version)
        if isinstance(req, rpc.Ping):
            pids = [0] * trainer.world
            if trainer.distributed:
                dist.all_gather_object(pids, os.getpid(), group=trainer.control_group)
            else:
                pids = [os.getpid()]
            return rpc.Pong(
                world_size=trainer.world,
                pids=pids,
                version=trainer.version,
                step=trainer.step,
                device=str(trainer.device),
            )
        if isinstance(req, rpc.Shutdown):
            return rpc.Done()
        raise TypeError(f"unknown request {type(req).__name__}")

    return execute


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spade_async.trainer.main")
    parser.add_argument("--model-dir", required=True, help="HF model directory to train")
    parser.add_argument("--config-json", default="{}", help="TrainerConfig as JSON")
    parser.add_argument("--socket", required=True, help="Unix socket path rank 0 serves on")
    parser.add_argument("--load", default="", help="checkpoint directory to resume from")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads per rank")
    args = parser.parse_args(argv)
    cfg = msgspec.json.decode(args.config_json, type=TrainerConfig)
    if args.threads:
        torch.set_num_threads(args.threads)
    device, control = _setup(cfg.offload)
    try:
        trainer = Trainer(cfg, args.model_dir, device)
        trainer.control_group = control
        if args.load:
            load_checkpoint(trainer, args.load)
        execute = make_executor(trainer)
        if trainer.rank == 0:
            rpc.serve(args.socket, execute, trainer.vocab_size, control)
        else:
            rpc.follow(execute, control)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # an exception in any rank: one record for the controller's error line (failure.py)
    sys.exit(run_recorded(main, who=f"trainer rank {os.environ.get('RANK', '0')}"))
