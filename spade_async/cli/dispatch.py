"""``spade`` command line: dispatch to one module per subcommand, imported lazily.

Each subcommand module exposes ``main(argv: list[str]) -> int`` with its own argparse
parser. A ``SpadeError`` becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import importlib
import os
import sys

from spade_async.errors import SpadeError
from spade_async.safe_text import term

COMMANDS = {
    "env": ("spade_async.envs.cli", "check generated or hand-written environments"),
    "memory": ("spade_async.memory.cli", "inspect, import and export the environment memory"),
    "corpus": ("spade_async.cli.corpus", "sample grounding documents from a corpus"),
    "train": ("spade_async.cli.train", "run SPADE, a baseline or an ablation from a recipe"),
    "dashboard": ("spade_async.telemetry.cli", "watch a run's metrics in the terminal"),
    "demo": ("spade_async.cli.demo", "run the demo on the embedded default model"),
    "episode": ("spade_async.episodes.cli", "list recorded episodes and replay them"),
    "report": ("spade_async.report.cli", "an HTML report of a run (figures, archive, eval)"),
    "eval": ("spade_async.eval.cli", "held-out evaluation on the paper's benchmarks"),
    "slurm": ("spade_async.launch.slurm", "print an sbatch script for a multi-node recipe"),
    "plan": ("spade_async.plan.cli", "simulate a recipe's step time by GPU placement"),
}


def _usage() -> str:
    lines = ["usage: spade COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:<10} {doc}" for name, (_, doc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"spade: unknown command '{name}'; run 'spade --help' for the list", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("spade_async"):
            print(
                f"spade: '{name}' is not implemented yet ({exc.name} is missing)", file=sys.stderr
            )
            return 2
        raise
    try:
        return int(module.main(rest) or 0)
    except SpadeError as exc:  # one line: the message may quote run-directory contents
        print(f"spade {name}: error: {term(exc)}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # from a task group: report the user-facing cause
        errors = _leaves(group)
        spade = [e for e in errors if isinstance(e, SpadeError)]
        if not spade or len(spade) != len(
            [e for e in errors if not isinstance(e, KeyboardInterrupt)]
        ):
            raise
        print(f"spade {name}: error: {term(spade[0])}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `spade memory ls | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a tool killed by SIGPIPE


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


if __name__ == "__main__":
    sys.exit(main())
