"""The Reasoning Agent: multi-turn episodes against sandboxed environment instances.

One episode: open an instance in the pool, ``reset(seed)``, template the first observation
(with ``"\\n\\nHINT: {hint}"`` appended for hinted plays), then generate a turn, ``step()``
the instance with the reply, append the observation's tokens, repeat until terminated,
truncated, or a turn/token limit. Token ids, the loss mask (agent tokens only), the engine's
rollout log-probs and the policy version of every turn are kept for the trainer.

What ``step()`` receives is the reference's ``parse_action`` (``utils/parsing.py``): the
visible reply (reasoning stripped) reduced to its first ``\\boxed{X}`` re-wrapped as
``\\boxed{X}``, or the stripped reply when it boxes nothing; tool-use replies go whole. A
turn cut by the token budget (no EOS: finish reason ``length``) ends the episode as
``reply_cut``, reward 0, without reaching ``step()`` (``orchestrator.py``: a missing EOS
marks the trajectory truncated).

Environment failures during play (timeouts, crashes, bad outputs) are data: the episode
ends with a status, never an exception. A timeout scores ``timeout_reward`` (the reference's
-0.5, ``rewards.timeout_reward``); a crash or bad return is not the agent's fault: status
``env_error``, and the batcher leaves it out of the agent's GRPO group (``FAULT_STATUSES``
mark the environment for the designer's penalty).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from spade_async.config import Doc
from spade_async.envs.pool import EnvError
from spade_async.generation.chat import Conversation, strip_think
from spade_async.generation.client import EngineRequestError
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.seeds import request_seed
from spade_async.rewards import agent_outcome
from spade_async.roles.episode_routes import EpisodeRoutes
from spade_async.roles.services import Services

Status = Literal[
    "terminated",
    "truncated",
    "turn_limit",
    "token_limit",
    "reply_cut",
    "timeout",
    "env_error",
    "empty_reply",
    "engine_error",
]

FAULT_STATUSES = frozenset({"timeout", "env_error"})  # the environment's fault: designer penalty
UNTRAINED_STATUSES = frozenset({"env_error", "engine_error"})  # not the agent's doing: no GRPO
# cut short (the reference's TrajectoryStatus.TRUNCATED): no gradient under agent.compact_filter
COMPACT_STATUSES = frozenset({"truncated", "turn_limit", "token_limit", "reply_cut"})

GAMES_SYSTEM = (
    "You are playing a text game: make valid moves to win. Read each observation, reason "
    "step by step, and put your final answer (one command) within \\boxed{}."
)
TOOL_SYSTEM = (
    "You solve tasks with tools. Call one tool per reply as "
    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>, and give the final answer as '
    "<answer>...</answer>."
)


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    plays_nohint: Doc(int, "episodes per environment without the hint") = 16
    plays_hint: Doc(int, "episodes per environment with the hint (for regret)") = 16
    plays_per_env: Doc(
        Literal["fill_batch", "fixed"],
        "fill_batch: ceil(batch_samples / environments played) no-hint plays each (the "
        "reference's collect stage; plays_nohint when batch_samples is 0); fixed: plays_nohint",
    ) = "fill_batch"
    train_on_hinted: Doc(
        bool, "also train the agent on hinted plays (privileged; off in SPADE)"
    ) = False
    max_turns: Doc(int, "turns per episode before it is cut") = 25
    max_turn_tokens: Doc(
        int, "new tokens per agent turn (reference --spare-actor-max-tokens 8192)"
    ) = 8192
    max_episode_tokens: Doc(
        int,
        "tokens per episode, prompt and observations included (reference "
        "--spare-max-context-length 32768)",
    ) = 32768
    temperature: Doc(float, "agent sampling temperature") = 0.6
    top_p: Doc(float, "agent nucleus sampling (reference --spare-actor-top-p 0.95)") = 0.95
    top_k: Doc(int, "agent top-k sampling, -1 = off (reference --spare-actor-top-k 20)") = 20
    cut_reply: Doc(
        Literal["end", "step"],
        "a turn cut by max_turn_tokens (no EOS): 'end' the episode, truncated, reward 0 (the "
        "reference), or 'step' the environment with it (settings whose action is a token or two)",
    ) = "end"
    compact_filter: Doc(
        bool,
        "no gradient on an episode cut short (env truncation, turn or token limit, a reply "
        "without EOS); it still counts in its GRPO group and the loss denominator "
        "(reference --spare-compact-filter, tool-use recipes)",
    ) = False
    mask_malformed_tool_calls: Doc(
        bool,
        "tool use: a turn whose tool call does not parse gets loss mask 0 (reference "
        "SPARE_MASK_MALFORMED_TOOLCALL=1)",
    ) = False
    enable_thinking: Doc(
        bool | None, "thinking mode for templates that have it; None = template default"
    ) = None
    thinking_fanout: Doc(
        bool,
        "one sample per turn, each carrying the whole episode's advantage; an episode's turn "
        "samples are one unit of the loss (one token mean per episode, as slime's group ids)",
    ) = False
    success_threshold: Doc(float, "an outcome reward at or above this counts as a win") = 1.0


class Episode(msgspec.Struct, kw_only=True):
    env_id: str
    seed: int
    hinted: bool
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turn_spans: list[tuple[int, int]]  # [start, end) of each generated turn in token_ids
    turn_versions: list[int]  # policy version that generated each turn
    reward: float  # outcome reward (SPADE: final step reward clipped, or a penalty)
    status: Status
    turns: int
    messages: list[dict[str, Any]]
    error: str = ""
    # what replay needs (spade_async.episodes): every action the environment received, the
    # reset observation then each step's observation (sha256 hex), each step's reward and
    # (terminated, truncated); an EnvError ends the lists at the call that raised it
    actions: list[str] = []
    obs_hashes: list[str] = []
    step_rewards: list[float] = []
    step_flags: list[tuple[bool, bool]] = []
    error_kind: str = ""
    # routing replay (client.enable_routes): the routes of token_ids[:len], compact
    # (generation/routed_experts.py), and why they are incomplete ("" complete, "missing":
    # an engine sent none, else the misfit naming the engine: the sample is dropped)
    routed_experts: bytes = b""
    routes_status: str = ""
    # several when a weight update broke the rows (roles/episode_routes.py): (first turn,
    # end turn, rows from position 0) per epoch, b"": those turns train without replay
    route_epochs: list[tuple[int, int, bytes]] = []

    @property
    def version(self) -> int:
        """Oldest policy version in the episode (what staleness is measured by)."""
        return min(self.turn_versions) if self.turn_versions else -1

    def won(self, threshold: float = 1.0) -> bool:
        return self.reward >= threshold


@dataclass
class EnvRef:
    env_id: str
    source: str
    setting: str = "games"


_session = itertools.count()
MIN_TURN_TOKENS = 64  # the reference's min_generation_tokens: context left that ends an episode


def boxed_content(text: str) -> str | None:
    """The reference's ``extract_boxed_answer``: the first ``\\boxed{X}`` with a brace-free X
    (also ``\\boxed{{X}}`` and ``\\boxed{{{X}}}``), else the last ``\\boxed{...}`` with
    nested braces balanced (up to two outer brace pairs peeled), else None."""
    if not text:
        return None
    for depth in (1, 2, 3):
        m = re.search(r"\\boxed" + r"\{" * depth + r"([^{}]+)" + r"\}" * depth, text)
        if m:
            return m.group(1).strip()
    at = text.rfind("\\boxed")
    start = text.find("{", at) if at >= 0 else -1
    if start < 0:
        return None
    level = 0
    for i in range(start, len(text)):
        level += {"{": 1, "}": -1}.get(text[i], 0)
        if level == 0:
            inner = text[start + 1 : i].strip()
            for _ in range(2):
                if inner.startswith("{") and inner.endswith("}"):
                    inner = inner[1:-1].strip()
            return inner
    return None


def malformed_tool_call(reply: str) -> bool:
    """The reply opens a ``<tool_call>`` but no block parses as a call (a JSON object with a
    string ``name``; ``arguments`` an object when present): the reference's
    SPARE_MASK_MALFORMED_TOOLCALL condition (``"<tool_call>" in raw_action`` and no call)."""
    if "<tool_call>" not in reply:
        return False
    for body in re.findall(r"<tool_call>(.*?)</tool_call>", reply, re.DOTALL):
        try:
            call = json.loads(body.strip())
        except ValueError:
            continue
        if (
            isinstance(call, dict)
            and isinstance(call.get("name"), str)
            and isinstance(call.get("arguments", {}), dict)
        ):
            return False
    return True


def parse_action(reply: str) -> str:
    """What a games ``step()`` receives: ``\\boxed{X}`` for the reply's boxed answer X, or the
    stripped reply when it boxes nothing (an empty box counts as nothing)."""
    x = boxed_content(reply)
    return f"\\boxed{{{x}}}" if x else reply.strip()


async def play_episode(
    services: Services,
    *,
    env: EnvRef,
    seed: int,
    hint: str | None,
    cfg: AgentConfig,
    version: int,
    timeout_reward: float = -0.5,
    request_key: int | None = None,
    pace: Any = None,
) -> Episode:
    """One episode; ``services.meters`` (telemetry Meters) gets engine and env-pool busy time;
    ``timeout_reward`` (``rewards.timeout_reward``) scores an environment timeout.
    ``request_key``: the play's request seed (``generation/seeds.py``: run seed, step,
    environment, slot); turn ``t`` samples with ``request_seed(request_key, t)``. None: a
    seed from the reset seed and the turn (a play of one seed repeats, hinted or not).
    ``pace`` (``envs.audit.Pace``): records the turn times for a scripted sibling play."""
    client, pool, tokenizer, meters = (
        services.client,
        services.pool,
        services.tokenizer,
        services.meters,
    )
    busy = meters.busy if meters is not None else _no_busy
    conv: Conversation | None = None
    spans: list[tuple[int, int]] = []
    versions: list[int] = []
    status: Status = "turn_limit"
    reward, error, error_kind = 0.0, "", ""
    actions: list[str] = []
    obs_hashes: list[str] = []
    step_rewards: list[float] = []
    step_flags: list[tuple[bool, bool]] = []
    inst = None
    key = f"ep-{next(_session)}"
    routes = EpisodeRoutes(client, key)
    try:
        inst = await pool.open(env.source, env_id=env.env_id)
        if pace is not None:
            pace.open()
        obs, _ = await pool.reset(inst, seed)
        obs_hashes.append(obs_hash(obs))
        tool_use = env.setting == "tool_use"
        tools = await pool.get_tools(inst) if tool_use else None
        first = f"{obs}\n\nHINT: {hint}" if hint else obs
        system = TOOL_SYSTEM if tool_use else GAMES_SYSTEM
        conv = Conversation(
            tokenizer,
            [{"role": "system", "content": system}, {"role": "user", "content": first}],
            tools=tools,
            enable_thinking=cfg.enable_thinking,
        )
        while True:
            remaining = cfg.max_episode_tokens - len(conv.token_ids)
            if remaining <= MIN_TURN_TOKENS:  # the reference's context-full check
                status = "token_limit"
                break
            budget = min(cfg.max_turn_tokens, remaining - MIN_TURN_TOKENS)
            with busy("engine"):
                res = await client.generate(
                    conv.token_ids,
                    SamplingParams(
                        max_new_tokens=budget,
                        temperature=cfg.temperature,
                        top_p=cfg.top_p,
                        top_k=cfg.top_k,
                        sampling_seed=_turn_seed(request_key, seed, conv.turns),
                    ),
                    session_key=key,
                    routes_from=routes.start(),
                )
            routes.add(res, len(conv.token_ids))
            start = len(conv.token_ids)
            conv.add_assistant(res.output_ids, res.logprobs or None, res.text)
            spans.append((start, len(conv.token_ids)))
            if tool_use and cfg.mask_malformed_tool_calls and malformed_tool_call(res.text):
                conv.loss_mask[start:] = [0] * (len(conv.token_ids) - start)  # kept as context
            versions.append(res.policy(version))  # the engine's, for the tokens it generated
            if res.finish_reason == "length" and cfg.cut_reply == "end":  # no EOS: reward 0
                status = "reply_cut"
                break
            action = strip_think(res.text)  # the environment never sees the reasoning
            action = action if tool_use else parse_action(action)  # what step() receives
            actions.append(action)
            if pace is not None:
                pace.tick()
            with busy("env_pool"):
                obs, step_reward, terminated, truncated, _ = await pool.step(inst, action)
            obs_hashes.append(obs_hash(obs))
            step_rewards.append(float(step_reward))
            step_flags.append((bool(terminated), bool(truncated)))
            if terminated or truncated:
                status = "terminated" if terminated else "truncated"
                reward = agent_outcome(step_reward, terminated)
                break
            if not res.output_ids:
                status = "empty_reply"
                break
            if conv.turns >= cfg.max_turns:
                break
            conv.add_observation(obs, role="tool" if tool_use else "user")
    except EnvError as exc:
        timed_out = exc.kind == "timeout"
        status = "timeout" if timed_out else "env_error"
        reward = agent_outcome(0.0, False, timed_out=timed_out, timeout_reward=timeout_reward)
        error, error_kind = f"{exc.kind}: {exc}", exc.kind
    except EngineRequestError as exc:  # e.g. the episode outgrew the context: this request only
        status, error = "engine_error", str(exc)
    finally:
        if pace is not None:
            pace.end()
        client.end_session(key)
        if inst is not None:
            try:
                await pool.close(inst)
            except EnvError:
                pass
    routed_experts, route_epochs = routes.finish()
    return Episode(
        env_id=env.env_id,
        seed=seed,
        hinted=bool(hint),
        token_ids=conv.token_ids if conv else [],
        loss_mask=conv.loss_mask if conv else [],
        logprobs=conv.logprobs if conv else [],
        turn_spans=spans,
        turn_versions=versions,
        reward=reward,
        status=status,
        turns=len(spans),
        messages=conv.messages if conv else [],
        error=error,
        actions=actions,
        obs_hashes=obs_hashes,
        step_rewards=step_rewards,
        step_flags=step_flags,
        error_kind=error_kind,
        routed_experts=routed_experts,
        route_epochs=route_epochs,
        routes_status=routes.status,
    )


def obs_hash(obs: str) -> str:
    """The sha256 hex of an observation as the environment returned it (replay compares)."""
    return hashlib.sha256(obs.encode("utf-8", "surrogatepass")).hexdigest()


@contextlib.contextmanager
def _no_busy(stage: str):
    yield


def transcript(ep: Episode) -> str:
    """A readable text transcript of one episode."""
    head = (
        f"env {ep.env_id}  seed {ep.seed}  hinted {ep.hinted}  status {ep.status}  "
        f"reward {ep.reward:+.3f}  turns {ep.turns}  versions {ep.turn_versions}"
    )
    lines = [head, "=" * len(head)]
    for m in ep.messages:
        lines += [f"--- {m['role']} ---", str(m.get("content", ""))]
    if ep.error:
        lines += ["--- error ---", ep.error]
    return "\n".join(lines) + "\n"


def _turn_seed(request_key: int | None, seed: int, turn: int) -> int:
    """One turn's ``sampling_seed``: from the play's request seed, or (none given) from its
    reset seed, so a play repeats either way."""
    if request_key is None:
        return (seed * 1009 + turn) % 2**31
    return request_seed(request_key, turn)
