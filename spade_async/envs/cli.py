"""``spade env check FILE.py [--seeds 0,1,2] [--probe-seed N] [--json]`` -- run the gates.

Without ``--seeds`` the seeds are drawn at random per check (as training draws them); the
report names them and the garbage's seed, and ``--seeds ... --probe-seed N`` replays a check.

Exit status: 0 valid, 1 rejected, 2 usage error (missing file, bad flag, bad seeds).
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from spade_async.errors import SpadeError, UsageError
from spade_async.safe_text import json_line, term

_GATES = ("syntax", "structure", "load", "reset", "step", "determinism", "not_done_at_reset",
          "feasibility")  # fmt: skip


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UsageError(
            f"--seeds {text!r} is not a comma-separated list of integers; write --seeds 0,1,2"
        ) from None
    if not seeds:
        raise UsageError("--seeds is empty; write --seeds 0,1,2")
    return seeds


def _human(v) -> str:
    """The report, one line per gate; every text from the check is escaped (a reason or a
    name holding a newline cannot add a line of its own)."""
    v = msgspec.structs.replace(
        v, reason=term(v.reason, limit=4000), warnings=[term(w, limit=2000) for w in v.warnings],
        env_class=None if v.env_class is None else term(v.env_class, limit=200),
    )  # fmt: skip
    lines = []
    if v.valid:
        lines += [f"  pass  {g}" for g in _GATES]
    elif v.stage in _GATES:
        lines += [f"  pass  {g}" for g in _GATES[: _GATES.index(v.stage)]]
        lines.append(f"  FAIL  {v.stage}: {v.reason}")
    else:  # a resource stage (timeout, memory, crash, output_too_large) or multi_turn
        lines.append(f"  FAIL  {v.stage}: {v.reason}")
    lines += [f"  note  {w}" for w in v.warnings]
    head = "VALID" if v.valid else f"REJECTED at {v.stage}"
    extra = f"class={v.env_class} multi_turn={v.multi_turn} feasibility={v.feasibility}"
    if v.seeds:  # what replays this check exactly
        seeds = ",".join(str(s) for s in v.seeds)
        probe = f" --probe-seed {v.probe_seed}" if v.probe_seed is not None else ""
        lines.append(f"  replay  --seeds {seeds}{probe}")
    lines.append(f"{head}: {extra} isolation={v.isolation} ({v.seconds:.2f} s)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spade env", description="environment tools")
    sub = parser.add_subparsers(dest="cmd", required=True)
    check = sub.add_parser("check", help="run the validation gates on an environment file")
    check.add_argument("file", help="environment .py file")
    check.add_argument(
        "--seeds", default=None,
        help="comma-separated seeds (default: three drawn at random per check, as in training)",
    )  # fmt: skip
    check.add_argument(
        "--probe-seed", type=int, default=None,
        help="seed of the random garbage (default: fresh per check; the report names it)",
    )  # fmt: skip
    check.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    from spade_async.envs.pool import EnvError  # after argument errors: fast usage
    from spade_async.envs.validate import ValidateConfig, check_file

    try:
        verdict = check_file(args.file, seeds, config=ValidateConfig(probe_seed=args.probe_seed))
    except EnvError as exc:  # the sandbox itself failed (boot, capacity), not the environment
        raise SpadeError(f"the sandbox could not run the check: {exc}") from None
    if args.json:
        sys.stdout.write(json_line(verdict) + "\n")
    else:
        print(f"{term(args.file)}:")
        print(_human(verdict))
    return 0 if verdict.valid else 1
