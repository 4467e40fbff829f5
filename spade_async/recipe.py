"""The whole run's config: one struct composed of each component's own config struct.

Recipes are TOML files in ``configs/``; ``--set a.b=c`` overrides any leaf. ``mode`` picks
SPADE, a baseline or an ablation; it only flips the component switches listed in ``MODES``
(explicit keys in the recipe still win), so every mode is expressible as plain config too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from spade_async.config import Doc, apply_overrides, convert, read_toml
from spade_async.corpus.base import CorpusConfig
from spade_async.engines import EngineConfig
from spade_async.envs.audit import AuditConfig
from spade_async.envs.pool import PoolConfig
from spade_async.errors import ConfigError
from spade_async.eval.types import EvalConfig
from spade_async.generation.client import ClientConfig
from spade_async.loop.config import PipelineConfig
from spade_async.memory.store import MemoryConfig
from spade_async.placement import PlacementConfig
from spade_async.placement import check as check_placement
from spade_async.rewards import RewardConfig
from spade_async.rewards import check as check_rewards
from spade_async.roles.agent import AgentConfig
from spade_async.roles.designer import DesignerConfig
from spade_async.roles.hint import HintConfig
from spade_async.telemetry.config import TelemetryConfig
from spade_async.trainer.config import TrainerConfig

Mode = Literal[
    "spade",
    "fixed_pool",
    "frozen_designer",
    "no_corpus",
    "no_memory",
    "no_designer_training",
    "no_designer_training_no_memory",
]

# mode -> overrides applied *under* the recipe's own keys
MODES: dict[str, list[str]] = {
    "spade": [],
    "fixed_pool": [
        "designer_enabled=false",
        "hint.enabled=false",
        "agent.plays_hint=0",
        "replay_envs=8",
    ],
    "frozen_designer": ["designer_train=false"],
    "no_corpus": ["designer.use_corpus=false"],
    "no_memory": ["designer.use_memory=false"],
    "no_designer_training": ["designer_train=false"],
    "no_designer_training_no_memory": ["designer_train=false", "designer.use_memory=false"],
}


def _s(cls):
    return msgspec.field(default_factory=cls)


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Doc(str, "run name (default run directory: runs/<config file stem>-<time>)") = "spade"
    mode: Doc(
        Mode,
        "spade | fixed_pool | frozen_designer | no_corpus | no_memory | no_designer_training | no_designer_training_no_memory",
    ) = "spade"
    schedule: Doc(
        Literal["sync", "async"],
        "async: generation and training overlap; sync: generate, train, push in turn",
    ) = "async"
    max_steps: Doc(int, "policy updates to run") = 400
    seed: Doc(
        int,
        "seed for document, skill, memory and episode sampling, and (hashed with each "
        "request's identity) every generation request's sampling_seed",
    ) = 0
    deterministic: Doc(
        bool,
        "runs that repeat (docs/determinism.md): the engines run deterministic (CPU: one "
        "sequence at a time, no prefix cache, fixed threads; SGLang: "
        "--enable-deterministic-inference), the sync schedule (an async recipe runs its sync "
        "equivalent), episodes reach the trainer in a fixed order; two runs of one seed give "
        "the same step records (times aside), memory and weights",
    ) = False
    model: Doc(str, "embedded model name or local Hugging Face directory") = "smollm2-135m-instruct"
    designer_enabled: Doc(bool, "generate environments (false: agent plays memory/pool only)") = (
        True
    )
    designer_train: Doc(bool, "train the designer on its regret-based reward") = True
    regen_interval: Doc(
        int, "regenerate environments every N policy versions (delayed designer reward)"
    ) = 4
    replay_envs: Doc(int, "memory environments replayed to the agent each step (PLR sampling)") = 0
    fixed_pool: Doc(
        str,
        "environments imported into memory at start (fixed_pool mode): a directory of files, "
        "or a source by scheme: rg:NAME[,NAME..], gym:[MODULE:]ID, gem:ID, verifiers:MODULE "
        "(docs/interop.md)",
    ) = ""
    initial_memory: Doc(str, "'examples' (bundled environments), a directory, or '' for none") = (
        "examples"
    )
    max_staleness: Doc(int, "agent samples more than this many versions old are dropped") = 1
    batch_samples: Doc(
        int,
        "trim each step's batch to this many samples, designer samples first (the reference's "
        "global batch, 192); 0 keeps all",
    ) = 0
    checkpoint_every: Doc(
        int, "save a checkpoint every N steps and at the end; 0 = at the end only"
    ) = 10
    trainer_restarts: Doc(
        int,
        "times a dead trainer is restarted from the latest checkpoint (the steps since are "
        "redone from there; engines get its weights back); 0 stops the run with one line",
    ) = 2
    max_concurrent_episodes: Doc(int, "agent episodes in flight at once") = 64
    shutdown_grace_s: Doc(
        float, "after Ctrl-C, seconds in-flight work may finish before it is aborted"
    ) = 5.0
    designer: Doc(DesignerConfig, "Environment Designer") = _s(DesignerConfig)
    hint: Doc(HintConfig, "hint writer (not trained)") = _s(HintConfig)
    agent: Doc(AgentConfig, "Reasoning Agent") = _s(AgentConfig)
    rewards: Doc(RewardConfig, "rewards and advantages") = _s(RewardConfig)
    envs: Doc(PoolConfig, "sandboxed environment pool") = _s(PoolConfig)
    memory: Doc(MemoryConfig, "environment memory (LMDB)") = _s(MemoryConfig)
    corpus: Doc(CorpusConfig, "grounding corpus") = _s(CorpusConfig)
    engine: Doc(EngineConfig, "generation engines and their placement") = _s(EngineConfig)
    client: Doc(ClientConfig, "generation client") = _s(ClientConfig)
    trainer: Doc(TrainerConfig, "FSDP2 trainer ranks") = _s(TrainerConfig)
    telemetry: Doc(TelemetryConfig, "metrics and dashboard") = _s(TelemetryConfig)
    placement: Doc(PlacementConfig, "GPU placement of engines and trainer ranks") = _s(
        PlacementConfig
    )
    pipeline: Doc(PipelineConfig, "async schedule: streams and concurrency") = _s(PipelineConfig)
    eval: Doc(EvalConfig, "held-out evaluation during training (spade_async.eval)") = _s(EvalConfig)
    audit: Doc(
        AuditConfig, "scripted audit plays inside training and quarantine (docs/audits.md)"
    ) = _s(AuditConfig)


def load(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    data = read_toml(path) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    mode = data.get("mode", "spade")
    if mode not in MODES:
        raise ConfigError(f"config key 'mode' = {mode!r}: expected one of {', '.join(MODES)}")
    base = apply_overrides({}, MODES[mode])
    cfg = convert(Config, _merge(base, data))
    # the trainer follows the run: its model, and the rollout sampling temperature
    given = data.get("trainer", {})
    derived = {"temperature": cfg.agent.temperature, "model": cfg.model}
    derived = {k: v for k, v in derived.items() if k not in given}
    if derived:
        cfg = msgspec.structs.replace(cfg, trainer=msgspec.structs.replace(cfg.trainer, **derived))
    if cfg.deterministic and not cfg.engine.deterministic:  # the engines follow the run
        cfg = msgspec.structs.replace(
            cfg, engine=msgspec.structs.replace(cfg.engine, deterministic=True)
        )
    check(cfg)
    return cfg


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def engine_context(cfg: Config) -> int | None:
    """The SGLang engines' context length when the recipe sets one (``--context-length N``
    in ``engine.extra_args``); None: the model's own, unknown before the model loads."""
    args = list(cfg.engine.extra_args)
    for i, a in enumerate(args):
        value = a.split("=", 1)[1] if a.startswith("--context-length=") else None
        if a == "--context-length" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def check_budgets(cfg: Config) -> str | None:
    """A token budget the engine cannot serve, as one line (None: fine).

    An agent turn gets min(max_turn_tokens, context left - 64) (the reference's reserve): a
    context (``agent.max_episode_tokens``) that cannot hold a prompt plus the whole turn
    budget cuts every first turn short. An engine context (``--context-length``) below the
    agent's context, or below a designer prompt (at least ``corpus.max_words`` tokens of
    document) plus ``designer.max_new_tokens``, refuses those requests."""
    from spade_async.roles.agent import MIN_TURN_TOKENS

    a = cfg.agent
    if a.max_turn_tokens < 1:
        return f"agent.max_turn_tokens = {a.max_turn_tokens}: must be >= 1"
    need = a.max_turn_tokens + MIN_TURN_TOKENS + 1
    if a.max_episode_tokens < need:
        return (
            f"agent.max_episode_tokens ({a.max_episode_tokens}) cannot hold a prompt plus the "
            f"turn budget: agent.max_turn_tokens ({a.max_turn_tokens}) + the 64-token reserve "
            f"+ a prompt needs more than {need - 1}; raise max_episode_tokens or lower "
            "max_turn_tokens"
        )
    ctx = engine_context(cfg) if cfg.engine.kind == "sglang" else None
    if ctx is None:
        return None
    if a.max_episode_tokens > ctx:
        return (
            f"agent.max_episode_tokens ({a.max_episode_tokens}) exceeds the engine's context "
            f"(--context-length {ctx} in engine.extra_args); raise the context or lower "
            "max_episode_tokens"
        )
    words = cfg.corpus.max_words if cfg.designer.use_corpus else 0
    if cfg.designer_enabled and cfg.designer.max_new_tokens + words >= ctx:
        return (
            f"designer.max_new_tokens ({cfg.designer.max_new_tokens}) + a prompt of at least "
            f"corpus.max_words ({words}) tokens does not fit the engine's context "
            f"(--context-length {ctx}); raise the context or lower them"
        )
    return None


def check(cfg: Config) -> None:
    """Contradictions fail at start with one line."""
    check_placement(cfg)
    from spade_async.plan.checks import check_scale

    check_scale(cfg)  # LoRA / sequence parallel / offload that cannot work
    from spade_async.engines import check_engine

    check_engine(cfg.engine)  # SGLang flags the pinned release lacks
    from spade_async.eval.checks import check as check_eval

    check_eval(cfg.eval)
    if cfg.mode == "fixed_pool" and not cfg.fixed_pool and not cfg.initial_memory:
        raise ConfigError(
            "mode 'fixed_pool' needs environments: set fixed_pool = 'DIR' or initial_memory = 'examples'"
        )
    from spade_async.envs.sources import is_scheme, parse

    if cfg.fixed_pool and not is_scheme(cfg.fixed_pool) and not Path(cfg.fixed_pool).is_dir():
        raise ConfigError(
            f"fixed_pool '{cfg.fixed_pool}' is not a directory of environment files nor a "
            "source by scheme (rg:, gym:, gem:, verifiers:; docs/interop.md)"
        )
    if cfg.fixed_pool and is_scheme(cfg.fixed_pool):  # a bad scheme: one line (SourceError)
        src = parse(cfg.fixed_pool)
        need = set(src.packages)
        if src.scheme == "verifiers":  # the environment's own distribution is imported too
            from spade_async.envs.sources.verifiers import module_of

            need.add(module_of(src.value, src.target)[1])
        missing = sorted(need - set(cfg.envs.packages))
        if missing:
            raise ConfigError(
                f"fixed_pool '{cfg.fixed_pool}' imports {missing[0]!r} in the sandbox: add it to "
                f"envs.packages (envs.packages = {sorted(set(cfg.envs.packages) | set(missing))})"
            )
    if not cfg.designer_enabled and cfg.replay_envs < 1:
        raise ConfigError(
            "with the designer off the agent only replays memory: set replay_envs >= 1"
        )
    hints = cfg.hint.enabled and cfg.agent.plays_hint > 0
    bad = check_rewards(
        cfg.rewards, hints=hints, designer_train=cfg.designer_enabled and cfg.designer_train
    )
    if bad:
        raise ConfigError(bad)
    if cfg.designer.llm_validator:
        raise ConfigError(
            "designer.llm_validator = true: the reference's LLM environment validator is not "
            "implemented here; set it false (our validation gates still run)"
        )
    budget = check_budgets(cfg)
    if budget:
        raise ConfigError(budget)
    if cfg.max_steps < 1 or cfg.regen_interval < 1:
        raise ConfigError("max_steps and regen_interval must be at least 1")
    if cfg.checkpoint_every < 0:
        raise ConfigError(
            f"checkpoint_every = {cfg.checkpoint_every}: give N >= 1 steps, or 0 for the end only"
        )
    from spade_async.memory.records import skill_problem

    for skill in cfg.designer.skills:  # a skill names memory's index keys (as import checks)
        if (why := skill_problem(skill)) is not None:
            raise ConfigError(f"designer.skills: {why}; give short one-line names")
    if cfg.max_staleness < 0:
        raise ConfigError(f"max_staleness = {cfg.max_staleness}: must be >= 0")
    if cfg.agent.temperature <= 0 or cfg.designer.temperature <= 0:
        raise ConfigError(
            f"agent.temperature ({cfg.agent.temperature}) and designer.temperature "
            f"({cfg.designer.temperature}) must be > 0: trained rollouts are sampled, and their "
            "log-probs are log_softmax(logits / T)"
        )
    temps = {cfg.agent.temperature, cfg.designer.temperature}
    if cfg.designer_enabled and cfg.designer_train and len(temps) > 1:
        raise ConfigError(
            f"agent.temperature ({cfg.agent.temperature}) and designer.temperature "
            f"({cfg.designer.temperature}) differ but both roles train with trainer.temperature; "
            "set them equal"
        )
    if abs(cfg.trainer.temperature - cfg.agent.temperature) > 1e-9:
        raise ConfigError(
            f"trainer.temperature ({cfg.trainer.temperature}) must equal agent.temperature "
            f"({cfg.agent.temperature}): rollout log-probs are log_softmax(logits / T)"
        )
    if cfg.designer.family:
        from spade_async.settings import family

        family(cfg.designer.family)  # an unknown family is one line
        if cfg.designer.setting != "games":
            raise ConfigError(
                f"designer.family = {cfg.designer.family!r} builds games; "
                f"set designer.setting = 'games' (not {cfg.designer.setting!r})"
            )


def read_run_config(path: Path) -> tuple[dict, Config, list[str]]:
    """A run's ``config.toml`` for the commands that read a run (report, episode replay):
    (the TOML, the typed ``Config``, keys this version does not know). A file that is not
    TOML or holds a value of the wrong type is refused with the ``ConfigError`` a resume
    gives (one line, exit 2); unknown keys (an older or newer run) are only listed."""
    from spade_async.config import convert, known_only, read_toml

    data = read_toml(path)
    kept, unknown = known_only(Config, data)
    try:
        return data, convert(Config, kept), unknown
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}; fix the value (a resume refuses it too)") from None
