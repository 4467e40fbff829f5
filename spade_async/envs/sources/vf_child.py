"""Load a verifiers environment in a child interpreter, outside the sandbox, for ``verifiers:``.

Here the environment's module may read its package metadata, its Hugging Face cache and the
network, which the sandbox does not show: the dataset rows are materialised here, as plain
data, and written into the environment source as one literal. Then each row's own ``answer``
is played through the environment's own ``run_rollout`` with a scripted model (verifiers'
``Client``) that gives the answer every turn, in the forms a parser reads (as is, as
``\\boxed{...}``, as the ``XMLParser``'s answer field, each also after an empty
``<think></think>``); the first form whose reward (the rubric's own score) is 1.0 is the row's
``solution``, with the turns it took.

Reads ``{"module", "size", "max_turns", "check_s"}`` as JSON on stdin. Writes one
``repr(dict)`` per line (the parent reads each with ``ast.literal_eval``: data, never code):
first ``{"rows": [...], "notes": [...]}`` or ``{"error": [kind, message]}``; then one
``{"i", "solution", "turns", "score", "why"}`` per row with an answer, as each is checked, so
a check that hangs past the parent's timeout leaves the lines before it. A check that raises
or runs out of time (``check_s``, SIGALRM: a loop that never yields is stopped too) ends the
checks: an environment that fails on its own answers is the gates' to judge, sandboxed.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import signal
import sys
import warnings

from spade_async.envs.sources import literal
from spade_async.envs.sources.rg_child import plain

_OUT = sys.stdout  # our lines only: what the environment prints goes to stderr (main)


def emit(obj: dict) -> None:
    _OUT.write(repr(obj) + "\n")
    _OUT.flush()


def load(module: str):
    """The environment, or an ``{"error": ...}`` line's pair."""
    import verifiers as vf

    mod = importlib.import_module(module)
    if not callable(getattr(mod, "load_environment", None)):
        return None, ("no_loader", "the module has no load_environment()")
    env = vf.load_environment(module)
    if not isinstance(env, vf.Environment):
        return None, ("not_env", f"load_environment() gave a {type(env).__name__}")
    if env.tool_defs or isinstance(env, vf.ToolEnv):
        n = len(env.tool_defs or [])
        return None, (
            "not_text",
            f"it is a tool environment ({type(env).__name__}, {n} "
            "tool(s)) and structured tool calls do not carry over",
        )
    if env.requires_group_rollouts:
        return None, ("group", "its rubric scores groups of rollouts, not one episode")
    return env, None


def text_prompt(prompt) -> str | None:
    """Why ``prompt`` is not text messages (None when it is)."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list) or not prompt:
        return "no prompt messages"
    for m in prompt:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "text"):
            return f"a prompt message of role {m.get('role') if isinstance(m, dict) else m!r}"
        content = m.get("content")
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                return "a prompt message holds a non-text part (an image or audio)"
        elif not isinstance(content, str | None):
            return "a prompt message's content is not text"
    return None


def rows_of(env, size: int, notes: list[str]) -> list[dict]:
    own = env.dataset_source is not None or env.dataset is not None
    dataset = env.get_dataset() if own else env.get_eval_dataset()
    raw = dataset.select(range(min(size, len(dataset)))).to_list()
    out = []
    for i, row in enumerate(raw):
        row = {k: plain(v) for k, v in row.items() if k not in ("solution", "turns")}
        why = text_prompt(row.get("prompt"))
        if why is None:
            try:
                literal(row)
            except ValueError as exc:
                why = str(exc)
        if why is None:
            out.append(row)
        else:
            notes.append(f"row {i} left out: {why}")
    return out


def forms(env, answer: str) -> list[str]:
    """The answer as the parsers verifiers ships read it (tried in this order)."""
    parser = env.parser
    made = [answer, "\\boxed{" + answer + "}"]
    fields = getattr(parser, "get_fields", None)
    if callable(fields) and callable(getattr(parser, "format", None)):
        target = getattr(parser, "answer_field", "answer")
        names = fields()
        key = target if target in names else names[-1]
        try:
            made.append(parser.format(**{n: answer if n == key else "" for n in names}))
        except Exception:  # noqa: BLE001 - a parser whose format needs more
            pass
    made += ["<think>\n</think>\n" + m for m in made]
    return list(dict.fromkeys(made))


async def play(env, row: dict, reply: str, max_turns: int) -> tuple[float, int, str | None]:
    """(reward, turns, error) of a rollout whose model says ``reply`` every turn."""
    from verifiers.clients.client import Client
    from verifiers.types import Response, ResponseMessage

    class Scripted(Client):
        calls = 0

        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kw):
            Scripted.calls += 1
            if Scripted.calls > max_turns:
                raise RuntimeError(f"more than max_turns={max_turns} turns")
            return reply

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            msg = ResponseMessage(content=response, finish_reason="stop", is_truncated=False)
            return Response(id="check", created=0, model="check", message=msg)

        async def close(self):
            return None

    out = await env.run_rollout(dict(row), Scripted(None), "check", {})
    err = out.get("error")
    return float(out.get("reward") or 0.0), Scripted.calls, (str(err)[:200] if err else None)


class OutOfTime(BaseException):
    """The check's time is up (a BaseException: an environment's own ``except Exception``
    and verifiers' ``except asyncio.TimeoutError`` do not swallow it)."""


def _alarm(signum, frame):
    raise OutOfTime("the check ran out of time")


def check(env, i: int, row: dict, max_turns: int, check_s: float) -> dict:
    best, why = 0.0, None
    signal.signal(signal.SIGALRM, _alarm)
    for reply in forms(env, str(row["answer"])):
        signal.setitimer(signal.ITIMER_REAL, check_s)
        try:
            score, turns, err = asyncio.run(play(env, row, reply, max_turns))
        except BaseException as exc:  # noqa: BLE001 - the environment's own failure, named
            return {"i": i, "solution": None, "turns": 0, "score": None,
                    "why": f"{type(exc).__name__}: {str(exc)[:200]}"}  # fmt: skip
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if err is None and score >= 1.0:
            return {"i": i, "solution": reply, "turns": turns, "score": score, "why": None}
        best, why = max(best, score), why or err
    return {"i": i, "solution": None, "turns": 0, "score": best, "why": why}


def main() -> None:
    args = json.loads(sys.stdin.read())
    warnings.simplefilter("ignore")
    sys.stdout = sys.stderr
    try:
        env, error = load(args["module"])
        notes: list[str] = []
        rows = rows_of(env, int(args["size"]), notes) if env is not None else []
    except Exception as exc:  # noqa: BLE001 - named in one line by the parent
        env, error = None, ("load", f"{type(exc).__name__}: {str(exc)[:300]}")
    if error is not None:
        emit({"error": list(error)})
        return
    if not rows and notes and "non-text" in notes[0]:
        emit({"error": ["not_text", f"its prompts are not text ({notes[0]})"]})
        return
    emit({"rows": rows, "notes": notes})
    for i, row in enumerate(rows):
        if isinstance(row.get("answer"), str) and row["answer"].strip():
            done = check(env, i, row, int(args["max_turns"]), float(args["check_s"]))
            emit(done)
            if done["score"] is None:  # the environment failed: the gates judge the rest
                return


if __name__ == "__main__":
    main()
