"""The environment source that ``verifiers:`` writes: a verifiers environment's own rollout,
inverted into ``reset(seed)``/``step(action)``.

Inside the sandbox worker the source loads the environment once (``verifiers.load_environment
(MODULE)``) and, per episode, runs the environment's own ``rollout`` for the row
``ROWS[seed % len(ROWS)]`` on an asyncio loop of its own, with a *channel* for a model: a
``verifiers.clients.Client`` whose request parks the rollout until ``step(action)`` gives the
reply. So the environment's own ``setup_state``, stop conditions (``is_completed``),
``env_response`` and cleanup run as verifiers runs them. When the rollout ends, the rubric
scores it (``rubric.score_rollout``: the weighted sum of its reward functions, what
``Environment.run_rollout`` does) and that score is the reward of the last step; earlier
steps give 0. ``solution()`` is the row's answer as the importer found the parser reads it
(checked to score 1.0 outside the sandbox), once per turn it took.

Observations are text: at ``reset`` the prompt's messages (system prompt, few-shot turns,
user message: their contents joined by blank lines, messages of other roles than system and
user prefixed with their role); after a step, the messages the environment answered with
(those after the last assistant message). A content part that is not text is an error.
"""

from __future__ import annotations

from spade_async.envs.sources import class_name, literal

# The sandbox worker clears the environment and shows no home: the Hugging Face libraries
# that verifiers imports would look for a cache under the home and for the network.
_ENVIRON = {
    "HF_HOME": "/tmp/hf", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "TQDM_DISABLE": "1", "VF_LOG_LEVEL": "ERROR",
}  # fmt: skip

_BODY = '''

for _key, _value in ENVIRON.items():
    os.environ.setdefault(_key, os.path.join(os.environ.get("TMPDIR", "/tmp"), "hf")
                          if _key == "HF_HOME" else _value)

import verifiers  # noqa: E402
from verifiers.clients.client import Client  # noqa: E402
from verifiers.types import Response, ResponseMessage  # noqa: E402

_LOADED = []


def _environment():
    """The verifiers environment, loaded once per worker."""
    if not _LOADED:
        _LOADED.append(verifiers.load_environment(MODULE))
    return _LOADED[0]


def _field(message, name):
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def _text(message):
    content = _field(message, "content")
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        kind, text = _field(part, "type"), _field(part, "text")
        if kind != "text" or not isinstance(text, str):
            raise TypeError(f"a {{kind}} content part is not text")
        parts.append(text)
    return "\\n".join(parts)


def _render(messages):
    out = []
    for message in messages:
        role, text = _field(message, "role"), _text(message)
        if text:
            out.append(text if role in ("system", "user", "text") else f"{{role}}: {{text}}")
    return "\\n\\n".join(out)


def _after_reply(messages):
    """The messages after the last assistant message."""
    last = max((i for i, m in enumerate(messages) if _field(m, "role") == "assistant"), default=-1)
    return list(messages)[last + 1 :]


class _Channel(Client):
    """A verifiers client whose model is ``step()``: each request parks the rollout."""

    def __init__(self, loop):
        super().__init__(None)
        self.loop, self.asked = loop, loop.create_future()

    def setup_client(self, config):
        return None

    async def to_native_tool(self, tool):
        return tool

    async def to_native_prompt(self, messages):
        return messages, {{}}

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        reply = self.loop.create_future()
        self.asked.set_result((prompt, reply))
        return await reply

    async def raise_from_native_response(self, response):
        return None

    async def from_native_response(self, response):
        message = ResponseMessage(content=response, finish_reason="stop", is_truncated=False)
        return Response(id="spade", created=0, model="spade", message=message)

    async def close(self):
        return None


async def _play(env, row, channel):
    """What ``Environment.run_rollout`` does for one row: the rollout, then its score."""
    state = await env.rollout(row, channel, "spade", {{}})
    await env.rubric.score_rollout(state)
    await env.rubric.cleanup(state)
    return state


class {cls}:
    """A verifiers environment: one dataset row per seed, the rubric's score as the reward."""

    def __init__(self, max_turns=MAX_TURNS, **kwargs):
        self.max_turns = max(1, int(max_turns))
        self._env = _environment()
        self._loop = asyncio.new_event_loop()
        self._task = self._channel = self._reply = None
        self.index, self.turn, self.done = 0, 0, True

    def _stop(self):
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self._loop.run_until_complete(asyncio.gather(self._task, return_exceptions=True))
        self._task = None

    def _advance(self):
        """Run the rollout until it asks the model again (its prompt) or ends (None)."""
        asked = self._channel.asked
        self._loop.run_until_complete(
            asyncio.wait({{self._task, asked}}, return_when=asyncio.FIRST_COMPLETED)
        )
        if asked.done():
            prompt, self._reply = asked.result()
            return prompt
        self._task.result()  # the rollout's own exception, if it raised one
        return None

    def _info(self, state=None):
        info = {{"module": MODULE, "index": self.index, "turn": self.turn}}
        if state is not None:
            info["stop"] = str(state.get("stop_condition"))
            if state.get("error") is not None:
                info["error"] = str(state["error"])[:300]
        return info

    def reset(self, seed=None):
        self._stop()
        self.index = (0 if seed is None else int(seed)) % len(ROWS)
        self.turn, self.done = 0, False
        self._channel = _Channel(self._loop)
        row = {{k: v for k, v in ROWS[self.index].items() if k not in ("solution", "turns")}}
        self._task = self._loop.create_task(_play(self._env, row, self._channel))
        prompt = self._advance()
        if prompt is None:
            raise RuntimeError("the rollout ended before it asked the model anything")
        return _render(prompt), self._info()

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, self._info()
        self.turn += 1
        self._channel.asked = self._loop.create_future()
        self._reply.set_result(str(action))
        prompt = self._advance()
        if prompt is None:
            self.done = True
            state = self._task.result()
            obs = _render(_after_reply(state.get("completion") or []))
            return obs, float(state.get("reward") or 0.0), True, False, self._info(state)
        obs = _render(_after_reply(prompt))
        if self.turn >= self.max_turns:
            self.done = True
            self._stop()
            return obs, 0.0, False, True, self._info()
        return obs, 0.0, False, False, self._info()

    def solution(self):
        row = ROWS[self.index]
        return [row["solution"]] * row["turns"] if row.get("solution") is not None else ""

    def close(self):
        self._stop()
        self._loop.close()
'''


def source(module: str, rows: list[dict], *, origin: str, max_turns: int) -> str:
    """The environment source for ``module`` over ``rows`` (each value a literal)."""
    head = [
        '"""A verifiers environment, imported by spade-async (spade_async/envs/sources/',
        "verifiers.py): its own rollout, env_response and rubric, one dataset row per seed.",
        "",
        'Every value below is a literal written by the importer."""',
        "",
        "import asyncio",
        "import os",
        "",
        f"SKILL = {literal(('vf-' + module)[:200])}",
        f"ORIGIN = {literal(origin)}",
        f"MODULE = {literal(module)}",
        f"MAX_TURNS = {literal(max_turns)}",
        f"ENVIRON = {literal(_ENVIRON)}",
        f"ROWS = {literal(rows)}",
    ]
    return "\n".join(head) + "\n" + _BODY.format(cls=class_name(module))
