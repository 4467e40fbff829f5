"""The range of every numeric config value: one table beside the schema, checked at load.

``config.convert`` checks types (msgspec, strict); this module checks ranges, right after,
for every command that reads a recipe or a run's ``config.toml`` (train, demo, resume, plan,
eval, slurm, report, replay): ``check(cfg)`` walks the converted struct and refuses the first
value outside its ``Range`` with one line::

    config: agent.temperature = nan is out of range: must be in (0, 100]

Keys are dotted paths of ``recipe.Config``; a list's or tuple's elements share their key
(``engine.cpus``), a dict's keys are ``*`` (``eval.overrides.*.temperature``). A float that is
NaN or infinite is refused anywhere, with or without an entry. ``tests/unit/
test_config_bounds.py`` fails when a numeric field has no entry here. Standard library only:
the same layer as ``config``; the table names paths, it imports no component.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import msgspec

from spade_async.errors import ConfigError

__all__ = ["Range", "BOUNDS", "URLS", "check", "check_flag", "problem", "url_problem"]


class Range(NamedTuple):
    lo: float
    hi: float
    lo_open: bool = False  # (lo, ... : lo itself is out
    hi_open: bool = False
    also: tuple = ()  # values allowed outside [lo, hi] (top_k = -1: off)

    def holds(self, v: float) -> bool:
        if v in self.also:
            return True
        if isinstance(v, float) and not math.isfinite(v):
            return False
        above = v > self.lo if self.lo_open else v >= self.lo
        below = v < self.hi if self.hi_open else v <= self.hi
        return above and below

    def __str__(self) -> str:
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        span = f"{left}{_num(self.lo)}, {_num(self.hi)}{right}"
        extra = " or ".join(_num(a) for a in self.also)
        return f"{extra} or in {span}" if extra else f"in {span}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else repr(x)


def closed(lo: float, hi: float) -> Range:
    return Range(lo, hi)


def above(lo: float, hi: float) -> Range:
    """(lo, hi]: a positive quantity (a temperature, a timeout, a scale)."""
    return Range(lo, hi, lo_open=True)


DAY, WEEK = 86_400.0, 604_800.0
N = 10**9  # counts: steps, samples, entries
TOKENS = 1 << 24  # a token budget (16 M)
SEED = closed(0, 2**32 - 1)
PORT = closed(0, 65_535)  # 0: pick a free one
TOP_K = Range(1, 10**7, also=(-1,))  # -1: off
PROB = closed(0, 1)
REWARD = closed(-1e6, 1e6)

BOUNDS: dict[str, Range] = {
    # the run
    "max_steps": closed(1, N),
    "seed": SEED,
    "regen_interval": closed(1, 10**6),
    "replay_envs": closed(0, 10**6),
    "max_staleness": closed(0, 10**6),
    "batch_samples": closed(0, N),
    "checkpoint_every": closed(0, N),
    "trainer_restarts": closed(0, 10**6),
    "max_concurrent_episodes": closed(1, 10**7),
    "shutdown_grace_s": closed(0, DAY),
    # designer
    "designer.skills_per_regen": closed(1, 10**4),
    "designer.prompts_per_skill": closed(1, 10**6),
    "designer.samples_per_prompt": closed(1, 10**4),
    "designer.temperature": above(0, 100),
    "designer.top_p": above(0, 1),
    "designer.top_k": TOP_K,
    "designer.max_new_tokens": closed(1, TOKENS),
    "designer.repair_turns": closed(0, 100),
    "designer.code_head_lines": closed(0, 10**6),
    "designer.memory_window": closed(1, N),
    "designer.retries": closed(0, 1000),
    "designer.validation_seeds": SEED,
    # hint writer
    "hint.temperature": closed(0, 100),  # not trained: 0 = greedy is fine
    "hint.max_new_tokens": closed(1, TOKENS),
    "hint.retries": closed(0, 1000),
    "hint.max_code_chars": closed(0, N),
    # agent
    "agent.plays_nohint": closed(1, 10**6),
    "agent.plays_hint": closed(0, 10**6),
    "agent.max_turns": closed(1, 10**6),
    "agent.max_turn_tokens": closed(1, TOKENS),
    "agent.max_episode_tokens": closed(1, TOKENS),
    "agent.temperature": above(0, 100),
    "agent.top_p": above(0, 1),
    "agent.top_k": TOP_K,
    "agent.success_threshold": REWARD,
    # rewards
    "rewards.regret_scale": above(0, 1e6),
    "rewards.blend_regret_weight": PROB,
    "rewards.plateau_low": PROB,
    "rewards.plateau_high": PROB,
    "rewards.plateau_ramp": above(0, 1),
    "rewards.variance_target": closed(0, 1e6),
    "rewards.variance_width": above(0, 1e6),
    "rewards.duplicate_penalty": closed(0, 1e6),
    "rewards.max_role_scale": above(0, 1e9),
    "rewards.lp_slow_weight": PROB,
    "rewards.timeout_reward": REWARD,
    "rewards.env_fault_reward": REWARD,
    # sandboxed environments
    "envs.max_workers": closed(1, 10**5),
    "envs.prewarm": closed(0, 10**5),
    "envs.call_timeout_s": above(0, DAY),
    "envs.open_timeout_s": above(0, DAY),
    "envs.boot_timeout_s": above(0, DAY),
    "envs.capacity_wait_s": closed(0, DAY),
    "envs.memory_mb": closed(16, 1 << 24),
    "envs.cpu_seconds": closed(1, 10**8),
    "envs.file_mb": closed(1, 1 << 20),
    "envs.tmp_mb": closed(1, 1 << 20),
    "envs.shm_mb": closed(1, 1 << 20),
    "envs.open_files": closed(16, 1 << 20),
    "envs.nproc": closed(1, 1 << 22),
    "envs.max_obs_chars": closed(1, N),
    "envs.max_info_bytes": closed(1, 1 << 30),
    "envs.sink_chars": closed(0, N),
    "envs.workers_per_env": closed(0, 10**5),
    "envs.spread_step_ms": closed(0, 1e7),
    # environment memory (LMDB)
    "memory.initial_map_mib": closed(1, 1 << 24),  # 16 TiB
    "memory.max_batch": closed(1, 10**7),
    "memory.queue_size": closed(1, 10**8),
    "memory.near_dup_threshold": PROB,
    "memory.num_perm": closed(1, 1 << 16),
    "memory.shingle_tokens": closed(1, 10**4),
    "memory.positive_low": PROB,
    "memory.positive_high": PROB,
    "memory.too_easy_above": PROB,
    "memory.too_hard_below": PROB,
    "memory.n_positive": closed(0, 1000),
    "memory.n_negative": closed(0, 1000),
    "memory.diverse_pool": closed(1, 10**6),
    "memory.replay_buffer": closed(1, N),
    "memory.replay_temperature": above(0, 1e6),
    "memory.replay_staleness": PROB,
    # corpus
    "corpus.max_words": closed(1, N),
    "corpus.max_tokens": closed(1, N),
    # engines
    "engine.count": closed(0, 1024),  # 0: external engines only (engines.check_engine)
    "engine.threads": closed(0, 4096),
    "engine.cpus": closed(0, 1 << 16),
    "engine.gpus": closed(0, 4095),
    "engine.mem_fraction_static": above(0, 1),
    "engine.base_port": PORT,
    "engine.start_timeout_s": above(0, WEEK),
    "engine.max_restarts": closed(0, 10**6),
    "engine.max_running_requests": closed(0, 10**7),
    "engine.router_port": PORT,
    # generation client
    "client.request_timeout_s": above(0, WEEK),
    "client.connect_timeout_s": above(0, DAY),
    "client.max_retries": closed(0, 1000),
    "client.backoff_s": closed(0, DAY),
    "client.backoff_max_s": closed(0, DAY),
    "client.max_concurrency": closed(1, 10**7),  # 0: a client that never sends
    "client.health_timeout_s": above(0, DAY),
    "client.max_sessions": closed(1, N),
    # trainer
    "trainer.seed": SEED,
    "trainer.lr": closed(0, 1),
    "trainer.betas": Range(0, 1, hi_open=True),
    "trainer.weight_decay": closed(0, 10),
    "trainer.eps": above(0, 1),
    "trainer.warmup_steps": closed(0, N),
    "trainer.total_steps": closed(0, N),
    "trainer.min_lr_ratio": PROB,
    "trainer.grad_clip": closed(0, 1e9),
    "trainer.temperature": above(0, 100),
    "trainer.micro_batch_tokens": closed(1, 1 << 26),
    "trainer.clip_low": PROB,
    "trainer.clip_high": closed(0, 1e3),
    "trainer.tis_cap": closed(0, 1e6),  # 0: off
    "trainer.kl_coef": closed(0, 1e6),
    "trainer.entropy_coef": closed(0, 1e6),
    "trainer.sequence_parallel": closed(1, 1024),
    "trainer.start_timeout_s": above(0, WEEK),
    "trainer.push_timeout_s": above(0, WEEK),
    "trainer.lora.rank": closed(1, 1 << 16),
    "trainer.lora.alpha": above(0, 1e6),
    "trainer.lora.dropout": Range(0, 1, hi_open=True),
    # telemetry
    "telemetry.refresh_hz": above(0, 1000),
    "telemetry.episodes_per_step": closed(0, 10**6),
    "telemetry.replay_records": PROB,
    # placement
    "placement.trainer_gpus": closed(0, 4095),
    "placement.cpu_ranks": closed(1, 1024),
    "placement.trainer_threads": closed(0, 4096),
    "placement.trainer_cpus": closed(0, 1 << 16),
    "placement.controller_cpus": closed(0, 1 << 16),
    "placement.nnodes": closed(1, 10**5),
    "placement.node_rank": closed(0, 10**5),
    "placement.master_port": closed(1, 65_535),
    "placement.engine_nodes": closed(0, 10**5),
    "placement.engines_per_node": closed(1, 1024),
    "placement.gpus_per_node": closed(1, 1024),
    "placement.engine_port": closed(1, 65_535),
    # async pipeline
    "pipeline.queue_groups": closed(0, 10**6),
    "pipeline.groups_in_flight": closed(1, 10**6),
    "pipeline.groups_per_step": closed(0, 10**6),
    # audits (envs/audit.py)
    "audit.share": PROB,
    "audit.min_per_group": closed(0, 1000),
    "audit.garbage_replies": closed(0, 10**6),
    "audit.default_gap_s": closed(0, DAY),
    # evaluation
    "eval.interval": closed(0, N),
    "eval.n": closed(0, 10**6),
    "eval.limit": closed(0, N),
    "eval.max_tokens": closed(0, TOKENS),
    "eval.concurrency": closed(1, 10**6),
    "eval.overrides.*.n": closed(1, 10**6),
    "eval.overrides.*.temperature": closed(0, 100),
    "eval.overrides.*.top_p": above(0, 1),
    "eval.overrides.*.top_k": TOP_K,
    "eval.overrides.*.max_tokens": closed(1, TOKENS),
}

# string values that must be http(s)://host:port URLs (each element of a list)
URLS = ("engine.external",)


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an ``http(s)://host:port`` engine address, or None."""
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "an http(s)://host:port URL without spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "an http(s)://host:port URL with a port in [1, 65535]"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http(s)://host:port URL"
    if port is None or port == 0:
        return "an http(s)://host:port URL with a port in [1, 65535]"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return "an http(s)://host:port URL with no path, query or user"
    return None


def _line(path: str, value: Any, must: str) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"config: {path} = {shown} is out of range: must be {must}"


def problem(path: str, key: str, value: Any) -> str | None:
    """The one line for a leaf ``value`` at ``path`` (table key ``key``), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    bound = BOUNDS.get(key)
    if bound is None:
        if isinstance(value, float) and not math.isfinite(value):
            return _line(path, value, "a finite number")
        return None
    return None if bound.holds(value) else _line(path, value, str(bound))


def _prefixes() -> set[str]:
    keys = [*BOUNDS, *URLS]
    return {".".join(k.split(".")[:i]) for k in keys for i in range(1, k.count(".") + 2)}


_PREFIXES = _prefixes()


def _walk(value: Any, path: str, key: str):
    """(path, table key, leaf) for every leaf under ``value``: a struct, or the raw TOML
    tables it is converted from (a mapping key is literal where the table names it, else
    ``*``: ``eval.overrides.aime25.n`` -> ``eval.overrides.*.n``)."""
    if isinstance(value, msgspec.Struct):
        items = [(name, getattr(value, name)) for name in value.__struct_fields__]
    elif isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]", key)
        return
    else:
        yield path, key, value
        return
    for name, v in items:
        literal = f"{key}.{name}" if key else str(name)
        if not isinstance(value, msgspec.Struct) and literal not in _PREFIXES:
            literal = f"{key}.*" if key else "*"
        yield from _walk(v, f"{path}.{name}" if path else str(name), literal)


def check(cfg: Any, at: str = "") -> None:
    """ConfigError (one line) for the first value of ``cfg`` outside its range: a converted
    struct (defaults included), or the raw TOML tables before conversion (``config.convert``
    checks those first, so a struct's own ``__post_init__`` check never speaks first)."""
    for path, key, value in _walk(cfg, at, at):  # ``at``: a section checked alone
        if key in URLS and (why := url_problem(value)) is not None:
            raise ConfigError(_line(path, value, why))
        if (why := problem(path, key, value)) is not None:
            raise ConfigError(why)


def check_flag(flag: str, key: str | Range, value: Any) -> None:
    """A command-line flag that sets what config key ``key`` sets (``spade eval --n``): the
    same range (or a ``Range`` of its own), the same line, naming the flag."""
    if isinstance(key, str) and key in URLS:
        if value is not None and (why := url_problem(value)) is not None:
            raise ConfigError(f"{flag} = {value!r} is out of range: must be {why}")
        return
    bound = key if isinstance(key, Range) else BOUNDS[key]
    if (isinstance(value, (int, float)) and not isinstance(value, bool)) and not bound.holds(value):
        raise ConfigError(f"{flag} = {value!r} is out of range: must be {bound}")
