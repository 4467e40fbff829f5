"""The ACEBench multi_turn user simulator: any OpenAI-compatible ``/chat/completions``.

ACEBench plays the user with gpt-4o at temperature 0.001, top_p 1, 1,000 tokens; the URL and
model are the user's (``--user-sim URL --user-sim-model NAME``; an API key, when the endpoint
needs one, from the environment variable named by ``acebench_agent.user_key_env``). A call
is retried twice (0.5 s, 1 s); then ``SimulatorError`` ends that episode with score 0 and the
reason in the sample's ``error``. The simulator's own lines go back to it as ``assistant``
turns and the agent's as ``user`` turns (ACEBench sends its own lines back as ``system``
turns, which OpenAI-compatible servers treat as instructions).
"""

from __future__ import annotations

import anyio
import httpx
import msgspec

__all__ = ["UserSimulator", "SimulatorError"]


class SimulatorError(Exception):
    pass


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Reply(msgspec.Struct):
    choices: list[_Choice]


_DECODE = msgspec.json.Decoder(_Reply)


class UserSimulator(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    model: str = "gpt-4o"
    key: str | None = None
    temperature: float = 0.001
    top_p: float = 1.0
    max_tokens: int = 1000

    @property
    def endpoint(self) -> str:
        url = self.url.rstrip("/")
        if url.endswith("/chat/completions"):
            return url
        return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")

    async def reply(self, client: httpx.AsyncClient, messages: list[dict]) -> str:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "top_p": self.top_p, "max_tokens": self.max_tokens}  # fmt: skip
        last: Exception | None = None
        for attempt in range(3):
            if attempt:
                await anyio.sleep(0.25 * 2**attempt)
            try:
                r = await client.post(self.endpoint, json=body, headers=headers)
                r.raise_for_status()
                return _DECODE.decode(r.content).choices[0].message.content or ""
            except (
                httpx.HTTPError,
                msgspec.DecodeError,
                msgspec.ValidationError,
                IndexError,
            ) as exc:
                last = exc
        raise SimulatorError(f"user simulator {self.endpoint}: {type(last).__name__}: {last}")
