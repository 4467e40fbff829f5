"""The Environment Designer: grounded prompts, generation, extraction, validation, memory.

One designer *group* is a prompt (skill + grounding document + memory examples) sampled
``samples_per_prompt`` times. Each sample's code is extracted and run through every
validation gate in the sandbox pool; optional repair turns feed the failing stage back, but
only the first attempt is trained (a broken first attempt earns reward 0). A sample still
broken after its repairs is retried with fresh samples of the same prompt (``retries``,
counted, never trained) so each regeneration fills its environments as the reference does. Every generated
file is saved under ``RUN_DIR/envs/`` with its verdict and recorded in memory.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import numpy as np

from spade_async.config import Doc
from spade_async.envs.extract import extract_code
from spade_async.envs.pool import EnvPool
from spade_async.envs.validate import ValidateConfig, Verdict, validate_source
from spade_async.generation.chat import Conversation, strip_think
from spade_async.generation.client import EngineRequestError
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.seeds import request_seed
from spade_async.memory.records import Origin, make_record
from spade_async.memory.sampling import designer_context
from spade_async.memory.writer import MemoryWriter
from spade_async.roles.prompts import SKILLS, designer_prompt, repair_prompt
from spade_async.roles.services import Services
from spade_async.rundir import RunDir
from spade_async.settings import family


class DesignerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    setting: Doc(Literal["games", "tool_use"], "environment setting the designer writes for") = (
        "games"
    )
    skills: Doc(tuple[str, ...], "target skills the designer is asked for") = SKILLS
    skills_per_regen: Doc(
        int, "skills per regeneration, taken round-robin from `skills` (reference rotation)"
    ) = 3
    prompts_per_skill: Doc(int, "designer prompts (each with its own document) per skill") = 8
    samples_per_prompt: Doc(
        int, "designer samples per prompt (1: one document per environment, as the reference)"
    ) = 1
    temperature: Doc(float, "designer sampling temperature") = 0.6
    top_p: Doc(float, "designer nucleus sampling (reference --spare-env-top-p 0.95)") = 0.95
    top_k: Doc(int, "designer top-k sampling, -1 = off (reference --spare-env-top-k 20)") = 20
    enable_thinking: Doc(
        bool | None,
        "thinking mode of the designer's chat template; None = the template's default. The "
        "reference's corpus path renders the designer prompt with the run-wide "
        "--apply-chat-template-kwargs (enable_thinking false in every shipped recipe)",
    ) = None
    max_new_tokens: Doc(int, "designer reply length limit in tokens") = 4096
    repair_turns: Doc(int, "repair turns that feed a failing stage back (never trained)") = 0
    difficulty: Doc(
        str,
        "easy | medium | hard: the share of the agent's max_turns a good player should need "
        "(medium = 1/2 to 3/4, as the reference)",
    ) = "medium"
    context: Doc(Literal["spade", "recent", "diverse"], "memory examples shown in the prompt") = (
        "spade"
    )
    use_corpus: Doc(bool, "ground prompts on corpus documents (ablation: no_corpus)") = True
    use_memory: Doc(bool, "show memory examples in prompts (ablation: no_memory)") = True
    code_head_lines: Doc(int, "lines of each memory example's code shown in the prompt") = 60
    memory_window: Doc(
        int,
        "memory examples come from the newest N valid environments (the reference's FIFO of "
        "200; memory keeps everything); 0 = the whole memory, highest regret first",
    ) = 200
    retries: Doc(
        int,
        "fresh samples (untrained, counted) after a broken first attempt and any repair, until "
        "one is valid (reference: 5 attempts per environment)",
    ) = 4
    validation_seeds: Doc(
        tuple[int, ...],
        "seeds the validation gates run; empty = drawn at random per check, as training "
        "draws them (a game honest only for well-known seeds cannot pass)",
    ) = ()
    gates: Doc(
        Literal["strict", "reference"],
        "validation gates: strict (ours: determinism, garbage probes, solution replay) or "
        "reference (load, reset, 3 steps; ablation). Strict gates score 0 designs the "
        "reference would accept, so they change designer rewards",
    ) = "strict"
    llm_validator: Doc(
        bool,
        "the reference's LLM environment validator (--spare-use-env-validator, tool-use "
        "recipes): not implemented; true is refused at start",
    ) = False
    family: Doc(
        str, "environment family whose parameters the designer writes ('' = free-form code)"
    ) = ""


@dataclass
class DesignSample:
    """One designer sample: the tokens to train on and what became of its environment."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    skill: str
    doc_id: str | None
    version: int
    verdict: Verdict  # of the first attempt (the one trained)
    env_id: str | None = None  # the environment that entered the pool (maybe after repair)
    source: str | None = None
    duplicate: bool = False
    repaired: bool = False
    retries: int = 0  # fresh untrained samples taken after a broken first attempt
    extra_tokens: int = 0  # repair-turn and retry tokens (generated, not trained)
    examples: list[str] = field(default_factory=list)
    # routing replay: routes of prompt + output less the last token (routed_experts.py);
    # routes_status as Episode's ("" complete, "missing", "stale": a weight update landed
    # while it generated, its rows are the re-prefill's (roles/episode_routes.py): trained
    # without replay, else the misfit naming the engine)
    routed_experts: bytes = b""
    routes_status: str = ""


@contextlib.contextmanager
def _no_busy(stage: str):
    yield


def _head(code: str, lines: int) -> str:
    return "\n".join(code.splitlines()[:lines])


def build_prompt(
    cfg: DesignerConfig,
    *,
    skill: str,
    document: str | None,
    store,
    rng: np.random.Generator,
    max_turns: int = 25,
) -> tuple[str, list[str]]:
    positives, negative, shown = [], None, []
    if cfg.use_memory and store is not None:
        window = cfg.memory_window or None
        for ex in designer_context(store, skill, strategy=cfg.context, rng=rng, window=window):
            rec = ex.record
            shown.append(rec.id)
            head = _head(rec.code, cfg.code_head_lines)
            if ex.role in ("too_easy", "too_hard"):
                rate = rec.stats.win_rate_nohint or 0.0
                why = f"{ex.role.replace('_', ' ')}: the agent won {rate:.0%} of plays"
                negative = (f"class {rec.env_class or '(unnamed)'}", why)  # by class, as the ref
            elif ex.role == "seed":
                positives.append((head, None, None))
            else:
                positives.append((head, rec.stats.win_rate_nohint or 0.0, rec.stats.regret))
    write = family(cfg.family).prompt if cfg.family else designer_prompt
    prompt = write(
        skill=skill,
        setting=cfg.setting,
        document=document,
        positives=positives,
        negative=negative,
        difficulty=cfg.difficulty,
        max_turns=max_turns,
    )
    return prompt, shown


async def design_group(
    services: Services,
    *,
    writer: MemoryWriter,
    run_dir: RunDir,
    cfg: DesignerConfig,
    prompt: str,
    skill: str,
    doc_id: str | None,
    version: int,
    examples: list[str] | None = None,
    seed: int | None = None,
) -> list[DesignSample]:
    """Sample one prompt ``samples_per_prompt`` times; validate, repair, save and record each.

    ``services.meters`` (telemetry Meters) gets generation as engine time and the validation gates
    as env_pool time. ``seed``: the group's request seed (``generation/seeds.py``); every
    request of the group derives its ``sampling_seed`` from it and its own place (sample,
    repair turn, retry), so a rerun of the run's seed samples the same replies."""
    client, pool, tokenizer, meters = (
        services.client,
        services.pool,
        services.tokenizer,
        services.meters,
    )
    busy = meters.busy if meters is not None else _no_busy
    messages = [{"role": "user", "content": prompt}]
    prompt_ids = Conversation(tokenizer, messages, enable_thinking=cfg.enable_thinking).token_ids
    sampling = SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        n=cfg.samples_per_prompt,
        sampling_seed=_seed(seed, "sample"),
    )
    try:
        with busy("engine"):
            results = await client.generate_n(prompt_ids, sampling)
    except EngineRequestError as exc:  # e.g. a document too long for the context: skip the group
        return [_rejected(prompt_ids, skill, doc_id, version, f"engine refused the prompt: {exc}")]
    out = []
    for j, res in enumerate(results):
        sample = DesignSample(
            prompt_ids=list(prompt_ids),
            output_ids=list(res.output_ids),
            logprobs=list(res.logprobs),
            skill=skill,
            doc_id=doc_id,
            version=res.policy(version),  # the engine's, for the tokens it generated
            verdict=Verdict(valid=False, stage="syntax", reason="no reply"),
            examples=list(examples or []),
            routed_experts=b"" if _across_update(res) else res.routed_experts or b"",
            routes_status=res.routes_problem
            or ("missing" if _wants_routes(client) and res.routed_experts is None else "")
            or ("stale" if _across_update(res) else ""),
        )
        with busy("env_pool"):
            source, verdict = await _check(res.text, pool, cfg, seed)
        sample.verdict = verdict
        await _record(writer, run_dir, sample, source, verdict, cfg)
        turns = 0
        conv = None
        while not verdict.valid and turns < cfg.repair_turns:
            turns += 1
            if conv is None:
                conv = Conversation(tokenizer, messages, enable_thinking=cfg.enable_thinking)
                conv.add_assistant(res.output_ids, None, res.text)
            conv.add_observation(repair_prompt(verdict.stage, verdict.reason))
            try:
                with busy("engine"):
                    fix = await client.generate(
                        conv.token_ids, _one(cfg, _seed(seed, "repair", j, turns)),
                        return_logprob=False,
                    )  # fmt: skip
            except EngineRequestError:  # the repair conversation outgrew the context
                break
            conv.add_assistant(fix.output_ids, None, fix.text)
            sample.extra_tokens += len(fix.output_ids)
            with busy("env_pool"):
                source, verdict = await _check(fix.text, pool, cfg, seed)
            sample.repaired = verdict.valid
            await _record(writer, run_dir, sample, source, verdict, cfg)
        await _retry(
            client, pool, writer, run_dir, cfg, sample, prompt_ids, busy,
            seed=_seed(seed, "retry", j),
        )  # fmt: skip
        out.append(sample)
    return out


def _across_update(res) -> bool:
    """A reply whose tokens span a weight update (routing replay: its rows are stale)."""
    return res.routed_experts is not None and (
        res.policy_version is not None and res.policy_version != res.weight_version
    )


def _wants_routes(client) -> bool:
    return getattr(client, "route_shape", None) is not None  # routing replay (enable_routes)


def _seed(seed: int | None, *place: object) -> int | None:
    """The request seed of one request of a group seeded ``seed`` (None: unseeded)."""
    return None if seed is None else request_seed(seed, *place)


def _one(cfg: DesignerConfig, seed: int | None = None) -> SamplingParams:
    """One more designer sample (a repair turn or a retry), sampled like the first."""
    return SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        sampling_seed=seed,
    )


async def _retry(
    client,
    pool,
    writer,
    run_dir,
    cfg: DesignerConfig,
    sample,
    prompt_ids,
    busy=None,
    seed: int | None = None,
) -> None:
    """Fresh samples of the same prompt until one is valid (at most ``cfg.retries``): the
    valid one enters the pool; none is trained (the sample keeps its first attempt)."""
    busy = busy or _no_busy
    while sample.env_id is None and sample.retries < cfg.retries:
        sample.retries += 1
        try:
            with busy("engine"):
                res = await client.generate(
                    list(prompt_ids), _one(cfg, _seed(seed, sample.retries)),
                    return_logprob=False,
                )  # fmt: skip
        except EngineRequestError:
            return
        sample.extra_tokens += len(res.output_ids)
        with busy("env_pool"):
            source, verdict = await _check(res.text, pool, cfg, seed)
        await _record(writer, run_dir, sample, source, verdict, cfg)


def _rejected(prompt_ids, skill, doc_id, version, reason: str) -> DesignSample:
    """A group the engine refused: one untrained sample that counts as a failed design."""
    return DesignSample(
        prompt_ids=list(prompt_ids),
        output_ids=[],
        logprobs=[],
        skill=skill,
        doc_id=doc_id,
        version=version,
        verdict=Verdict(valid=False, stage="prompt", reason=reason),
    )


async def _check(
    reply: str, pool: EnvPool, cfg: DesignerConfig, seed: int | None = None
) -> tuple[str | None, Verdict]:
    """The reply's environment and its verdict. ``seed`` (the request's): the gates' random
    seeds and garbage come from it and the file's text, so a rerun of the run's seed judges
    the same file the same way (None: drawn afresh, as ``spade env check``)."""
    fam = family(cfg.family) if cfg.family else None
    reply = strip_think(reply)  # code inside the reasoning is not the answer
    source = fam.build(reply) if fam else extract_code(reply)
    if not source:
        why = fam.no_parameter if fam else "the reply holds no Python code"
        return None, Verdict(valid=False, stage="syntax", reason=why)
    own = getattr(pool, "validate_source", None)  # a pool with its own verdicts (bench/simulate)
    if own is not None:
        return source, await own(source)
    return source, await validate_source(
        source, pool=pool, seeds=cfg.validation_seeds,
        config=ValidateConfig(gates=cfg.gates, probe_seed=_seed(seed, "validate", source)),
        setting=cfg.setting,  # a games environment is not asked for tools (as in training)
    )  # fmt: skip


async def _record(
    writer: MemoryWriter,
    run_dir: RunDir,
    sample: DesignSample,
    source: str | None,
    verdict: Verdict,
    cfg: DesignerConfig,
) -> None:
    if source is None:
        return
    rec = make_record(
        source,
        origin=Origin(kind="designer", policy_version=sample.version),
        valid=verdict.valid,
        stage=verdict.stage,
        reason=verdict.reason,
        env_class=verdict.env_class,
        multi_turn=verdict.multi_turn,
        feasibility=verdict.feasibility,
        skill=sample.skill,
        setting=cfg.setting,
        doc_id=sample.doc_id,
        shown=list(sample.examples),
    )
    put = await writer.put(rec)
    run_dir.save_env(rec.id, source, verdict)
    if verdict.valid:
        sample.env_id, sample.source = rec.id, source
        sample.duplicate = put.outcome != "new"
