"""The NCCL weight-update group of the ``distributed`` push: trainer rank 0 + every engine GPU.

A group lives as long as its members. The runtime numbers them (``group_epoch``: it goes up
when the trainer or an engine restarts) and each epoch gets its own group name
(``spade_weight_update_<epoch>``) and rendezvous port, so a restarted member never meets a
half-dead group of the same name:

- the trainer rank 0 that still holds an older group destroys it
  (``torch.distributed.destroy_process_group``);
- every engine is asked to drop the previous epoch's group (``POST
  /destroy_weights_update_group``, SGLang 0.5.23; a restarted engine, or one that never
  joined, answers with an error that is ignored);
- then the engines and rank 0 join the new group (``POST /init_weights_update_group`` in
  threads while rank 0 joins the same rendezvous).

The push that follows sends every weight, so a restarted engine holds the current policy
again after that push (the runtime pushes right after an engine restart).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import httpx

__all__ = ["GROUP", "group_name", "WeightGroup", "ensure_group"]

GROUP = "spade_weight_update"


def group_name(epoch: int) -> str:
    return f"{GROUP}_{epoch}"


class WeightGroup:
    """The group rank 0 is in: its epoch, name and torch process group."""

    def __init__(self, epoch: int, name: str, group: object) -> None:
        self.epoch, self.name, self.group = epoch, name, group


def _destroy_torch_group(group) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)


def ensure_group(
    trainer,
    client: httpx.Client,
    pool,
    engines: list[dict],
    *,
    epoch: int,
    previous_epoch: int,
    master_address: str,
    master_port: int,
    init_group: Callable,
    destroy_group: Callable | None = None,
    check: Callable,
) -> WeightGroup:
    """The group for ``epoch`` on trainer rank 0, made (and the old one dropped) if needed."""
    current: WeightGroup | None = getattr(trainer, "_weight_group", None)
    if current is not None and current.epoch == epoch:
        return current
    stale = {group_name(previous_epoch)} if previous_epoch >= 0 else set()
    if current is not None:
        stale.add(current.name)
        with contextlib.suppress(Exception):  # a group with a dead peer may fail to close
            (destroy_group or _destroy_torch_group)(current.group)
        trainer._weight_group = None
    for name in sorted(stale):
        for e in engines:
            with contextlib.suppress(httpx.HTTPError):
                client.post(f"{e['url']}/destroy_weights_update_group", json={"group_name": name})
    name = group_name(epoch)
    world = 1 + sum(e["tp_size"] for e in engines)
    offset, futures = 1, []
    for e in engines:
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": offset,
            "world_size": world,
            "group_name": name,
            "backend": "nccl",
        }
        futures.append(pool.submit(client.post, f"{e['url']}/init_weights_update_group", json=body))
        offset += e["tp_size"]
    group = init_group(master_address, master_port, world, name)
    for e, f in zip(engines, futures, strict=True):
        check(e["url"], f.result())
    trainer._weight_group = WeightGroup(epoch, name, group)
    return trainer._weight_group
