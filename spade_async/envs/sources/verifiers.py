"""``verifiers:MODULE`` -- an installed verifiers environment as environments of ours.

``MODULE`` is what ``verifiers.load_environment`` takes (``vf-reverse-text`` and
``owner/vf-reverse-text`` name the module ``vf_reverse_text``, as verifiers maps them); the
module's distribution must be installed (the sandbox binds it by name). Options: ``size``
(dataset rows taken, from the start of the training dataset, or the evaluation dataset when
there is none; default 100), ``per_env`` (rows per environment of ours, default all of them),
``max_turns`` (our cap on a rollout's turns, default 50; the environment's own stop
conditions end it first).

The rows and the check of their own answers come from a child interpreter outside the
sandbox (``vf_child``); the environment source (``vf_source``) runs the environment's own
rollout and rubric inside the worker. A row whose own answer does not score 1.0 in any form
a parser reads is left out and named; with no answers (or none that could be checked)
every row is kept and feasibility is "unverified". A missing module, a module without
``load_environment()``, a tool environment (not text turns), a rubric that scores groups, a
dataset of non-text prompts: one line, nothing stored.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys

from spade_async.envs.sources import Item, Source, SourceError, check_options, int_option, require
from spade_async.envs.sources.vf_source import source

GEN_TIMEOUT_S = 300  # the child: load the environment, make the rows, check their answers
CHECK_S = 20.0  # one row's answer check (every form of it)

_ERRORS = {
    "no_loader": "is not a verifiers environment module ({}); name a module that defines "
    "load_environment() (vf-init makes one)",
    "not_env": "is not a verifiers environment ({}); load_environment() must return a "
    "verifiers Environment",
    "not_text": "is not a text environment: {}; choose one whose prompts and turns are text",
    "group": "cannot be imported: {}; choose one whose rubric scores each rollout",
    "load": "cannot be loaded ({}); install what its load_environment() needs, or check it "
    "with: python -c 'import verifiers; verifiers.load_environment(\"MODULE\")'",
}


def module_of(value: str, target: str) -> tuple[str, str]:
    """(module, distribution) of ``target``: verifiers' own mapping, then the installed
    distribution that provides it (the sandbox binds distributions by name)."""
    module = target.replace("-", "_").split("/")[-1]
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module):
        raise SourceError(f"{value!r}: {module!r} is not a Python module name")
    top = module.split(".")[0]
    require(value, top, install=f"the verifiers environment that provides {module} "
            "(vf-install NAME, or pip install its package)")  # fmt: skip
    dists = importlib.metadata.packages_distributions().get(top, [])
    if not dists:
        raise SourceError(
            f"{value!r}: module {module!r} is not part of an installed distribution, so the "
            "sandbox cannot bind it; pip install the package that provides it"
        )
    return module, dists[0]


def generate(value: str, module: str, size: int, max_turns: int) -> list[dict]:
    """The child's lines (data): the rows first, then one check per row with an answer."""
    args = {"module": module, "size": size, "max_turns": max_turns, "check_s": CHECK_S}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "spade_async.envs.sources.vf_child"],
            input=json.dumps(args), capture_output=True, text=True, timeout=GEN_TIMEOUT_S,
        )  # fmt: skip
        out, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:  # the lines before the hang still count
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = f"timed out after {GEN_TIMEOUT_S} s"
    lines = []
    for line in out.splitlines():
        try:
            lines.append(ast.literal_eval(line))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            break  # not a line of ours (the child writes the environment's prints to stderr)
    if not lines or not isinstance(lines[0], dict):
        last = (err.strip().splitlines() or ["no output"])[-1][:300]
        raise SourceError(f"{value!r}: verifiers could not load {module!r} here: {last}")
    if "error" in lines[0]:
        kind, message = lines[0]["error"]
        raise SourceError(f"{value!r}: {module!r} " + _ERRORS[kind].format(message))
    return lines


def keep(rows: list[dict], checks: list[dict], notes: list[str]) -> list[dict]:
    """The rows to write: the checked ones when any is, else all (feasibility unverified)."""
    done = {c["i"]: c for c in checks if isinstance(c, dict) and "i" in c}
    answered = [i for i, r in enumerate(rows) if isinstance(r.get("answer"), str)
                and r["answer"].strip()]  # fmt: skip
    good = [i for i in answered if done.get(i, {}).get("solution") is not None]
    for i in answered:
        c = done.get(i)
        if c is None:
            notes.append(f"row {i}: its own answer not checked (a check failed or ran out of time)")
        elif c["solution"] is None and c["score"] is None:
            notes.append(f"row {i}: checking its own answer failed ({c['why']})")
        elif c["solution"] is None:
            why = f" ({c['why']})" if c["why"] else ""
            notes.append(f"row {i} left out: its own answer scores {c['score']:g}{why}")
    if good:
        for i in sorted(set(range(len(rows))) - set(good)):
            if i not in answered:
                notes.append(f"row {i} left out: no answer to check")
        return [rows[i] | {"solution": done[i]["solution"], "turns": done[i]["turns"]}
                for i in good]  # fmt: skip
    failed = any(done.get(i, {}).get("score", 0.0) is None or i not in done for i in answered)
    if answered and not failed:
        return []  # every own answer was checked and none scores 1.0
    notes.append("no row's own answer was verified: every row kept, feasibility unverified")
    return [r | {"solution": None, "turns": 0} for r in rows]


def items(src: Source) -> tuple[list[Item], list[str]]:
    check_options(src, {"size", "per_env", "max_turns"})
    size = int_option(src, "size", 100, 1, 100_000)
    per_env = int_option(src, "per_env", size, 1, 100_000)
    max_turns = int_option(src, "max_turns", 50, 1, 1000)
    require(src.value, "verifiers", install="verifiers")
    module, dist = module_of(src.value, src.target)
    lines = generate(src.value, module, size, max_turns)
    notes = list(lines[0]["notes"])
    rows = keep(lines[0]["rows"], lines[1:], notes)
    result: list[Item] = []
    extra = "" if max_turns == 50 else f"&max_turns={max_turns}"
    for lo in range(0, len(rows), per_env):
        chunk = rows[lo : lo + per_env]
        origin = f"verifiers:{module}?size={size}{extra}#{lo}:{lo + len(chunk)}"
        code = source(module, chunk, origin=origin, max_turns=max_turns)
        result.append(Item(code=code, origin=origin, skill=f"vf-{module}"[:200], packages=(dist,)))
    return result, notes
