"""What the checkpoint, export and weight-push modules share, public in one place.

The HF names of the policy's parameters (``PREFIX``, the LoRA naming rules), the tokenizer
files an export carries, the process-group barrier, and the engine HTTP helpers every push
path uses: SGLang's replies checked into one ``WeightPushError`` naming the engine and the
route, generation paused and weight-update sessions opened around a push (every engine
closed again, whatever fails), the version check after it, and the shared-memory root of
disk pushes. Imports nothing else of the trainer's, so ``checkpoint``, ``stream``, ``lora``,
``ipc`` and ``weights`` depend on it and never on each other in a circle.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch.distributed as dist
from torch import nn

from spade_async.errors import SpadeError

ADAPTER = "default"  # peft's adapter name inside the trainer's model

PREFIX = "causal_lm."
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "added_tokens.json",
)


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if is_dist():
        dist.barrier()


def replace_dir(tmp: Path, target: Path) -> None:
    """Put the finished directory ``tmp`` at ``target`` (a sibling), replacing what is there:
    readers see the old directory or the new one, never a half-written one (the old one is
    moved aside, the new one renamed in, then the old one removed)."""
    if target.exists():
        old = target.with_name(f".{target.name}-old-{os.getpid()}")
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(target)


def base_name(hf: str) -> str:
    """``...q_proj.base_layer.weight`` -> ``...q_proj.weight`` (the HF name)."""
    return hf.replace(".base_layer.", ".")


def lora_pairs(named: dict[str, nn.Parameter]) -> dict[str, tuple[str, str]]:
    """HF weight name -> (its lora_A name, its lora_B name) in ``named``."""
    out = {}
    for name in named:
        if name.endswith(".base_layer.weight"):
            module = name.removesuffix(".base_layer.weight")
            a, b = f"{module}.lora_A.{ADAPTER}.weight", f"{module}.lora_B.{ADAPTER}.weight"
            if a in named and b in named:
                out[base_name(name)] = (a, b)
    return out


class WeightPushError(SpadeError):
    """An engine refused the weights or reports another version than the trainer's."""


def reply_message(resp: httpx.Response) -> str:
    try:
        body = resp.json() if resp.content else {}
    except ValueError:
        return resp.text[:300] or f"HTTP {resp.status_code}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if body.get("message"):
            return str(body["message"])
    return resp.text[:300] or f"HTTP {resp.status_code}"


def check_reply(url: str, resp: httpx.Response) -> dict:
    """SGLang's answer, or one WeightPushError naming the engine, the route and its message
    (SGLang answers a refused update with HTTP 400 and ``{"success": false, "message"}``)."""
    try:
        body = resp.json() if resp.content else {}
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    if resp.status_code != 200 or not body.get("success", True):
        req = resp.request
        raise WeightPushError(
            f"engine {url} refused {req.method} {req.url.path} (HTTP {resp.status_code}): "
            f"{reply_message(resp)}"
        )
    return body


def post(client: httpx.Client, url: str, route: str, body: dict) -> dict:
    try:
        resp = client.post(f"{url}{route}", json=body)
    except httpx.HTTPError as exc:
        raise WeightPushError(
            f"engine {url}: POST {route} failed ({type(exc).__name__}: {exc})"
        ) from None
    return check_reply(url, resp)


def verify_version(client: httpx.Client, url: str, version: int) -> str:
    got = client.get(f"{url}/model_info").json().get("weight_version")  # SGLang 0.5.23
    if str(got) != str(version):
        raise WeightPushError(
            f"engine {url} reports weight version {got!r} after the push, trainer is at {version}"
        )
    return str(got)


@contextlib.contextmanager
def bracket(opened: list[str], close: Callable[[str], None]):
    """Run the body, then ``close`` every engine in ``opened`` (filled by the caller as it
    opens them), all of them whatever fails; close errors are never swallowed: they end the
    push, joined to the body's error when there is one (one error, every engine named)."""
    failed: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failed = exc
        raise
    finally:
        errors = []
        for url in opened:
            try:
                close(url)
            except WeightPushError as exc:
                errors.append(str(exc))
        if errors:
            first = f"{failed}; then " if failed is not None and str(failed) else ""
            raise WeightPushError(first + "; ".join(errors)) from failed


@contextlib.contextmanager
def paused(client: httpx.Client | None, urls: list[str], mode: str, stats: dict | None):
    """Pause generation on every engine for the body (no-op when ``mode`` is empty or on
    ranks without a client). Every engine a pause was sent to is continued, whatever fails
    (a refused pause on engine k still continues engines 0..k)."""
    if not mode or client is None:
        yield
        return
    t0, sent = time.perf_counter(), []
    try:
        with bracket(sent, lambda url: post(client, url, "/continue_generation", {})):
            for url in urls:
                sent.append(url)  # before: a pause that failed in flight may still have landed
                post(client, url, "/pause_generation", {"mode": mode})
            yield
    finally:
        if stats is not None:
            stats["paused_s"] = stats.get("paused_s", 0.0) + time.perf_counter() - t0


def begin_session(client: httpx.Client, url: str) -> None:
    """``/begin_weight_update``. A trainer killed mid-push leaves its session open (SGLang
    then refuses a second begin): that one is closed first, then a new one opened."""
    try:
        post(client, url, "/begin_weight_update", {})
    except WeightPushError as exc:
        if "already open" not in str(exc):
            raise
        post(client, url, "/end_weight_update", {})
        post(client, url, "/begin_weight_update", {})


@contextlib.contextmanager
def session(client: httpx.Client | None, urls: list[str]):
    """SGLang's weight-update session on every engine around the body:
    ``update_weights_from_distributed``/``_tensor`` are refused outside one
    (``sglang_state.SESSION_ROUTES``). Every opened session is closed, whatever fails."""
    if client is None:
        yield
        return
    opened: list[str] = []
    with bracket(opened, lambda url: post(client, url, "/end_weight_update", {})):
        for url in urls:
            begin_session(client, url)
            opened.append(url)
        yield


def shm_root(shm_dir: str) -> Path:
    if shm_dir:
        return Path(shm_dir)
    return Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())


def with_last(items):
    """(item, is_last) pairs, one item of look-ahead."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True
