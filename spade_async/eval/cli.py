"""``spade eval``: evaluate a model or a run, re-score saved completions, compare two results.

spade eval MODEL_OR_RUN_DIR --suites aime25,humaneval --n 4 --limit 30 --out DIR [--json]
spade eval MODEL --base-url http://127.0.0.1:30000 --suites rg_logic --out DIR
spade eval --responses DIR/aime25.jsonl --suites aime25 --out DIR2
spade eval --compare A/results.json B/results.json
spade eval MODEL --paper --data gpqa_diamond=F --data livecodebench=D --data acebench_agent=D --out DIR
spade eval MODEL --suites acebench_agent --data acebench_agent=ACEBench --user-sim URL
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import anyio
import msgspec

from spade_async.errors import UsageError
from spade_async.eval.metrics import PAPER_COLUMNS
from spade_async.eval.report import compare, print_summary, print_table, summary
from spade_async.eval.suites import SHIPPED, SUITES, make_suite
from spade_async.eval.types import Results

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spade eval", description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", help="embedded model name, Hugging Face dir or run dir")
    p.add_argument("--suites", default="", help=f"comma-separated: {', '.join(SUITES)}")
    p.add_argument("--paper", action="store_true",
                   help="the paper's table: its 8 held-out columns (their mean is the composite, "
                        "printed with a bootstrap interval), BFCL-v4 and ACEBench-Agent")  # fmt: skip
    p.add_argument("--n", type=int, default=0, help="samples per problem (0 = suite default)")
    p.add_argument("--limit", type=int, default=0, help="problems per suite (0 = all)")
    p.add_argument("--max-tokens", type=int, default=0, help="new tokens (0 = suite default)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    p.add_argument("--out", help="output directory (results.json, <suite>.jsonl)")
    p.add_argument("--base-url", help="use a running SGLang-compatible server")
    p.add_argument("--engine-threads", type=int, default=0,
                   help="torch threads of the CPU engine (0 = torch default; 1 on a busy machine)")  # fmt: skip
    p.add_argument("--data", action="append", default=[], metavar="SUITE=PATH",
                   help="data for gpqa_diamond, livecodebench, acebench_agent; options as "
                        "SUITE.OPTION=VALUE, e.g. livecodebench.release=v6, "
                        "livecodebench.start_date=2025-02-01, gpqa_diamond.extract=reference")  # fmt: skip
    p.add_argument("--user-sim", metavar="URL",
                   help="acebench_agent's multi_turn user: an OpenAI-compatible chat endpoint")  # fmt: skip
    p.add_argument("--user-sim-model", metavar="NAME", help="the user simulator's model (gpt-4o)")
    p.add_argument("--responses", help="re-score a saved <suite>.jsonl without generating")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two results.json files")
    p.add_argument("--json", action="store_true", help="print results as one JSON line last")
    return p


def _data(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not path:
            raise UsageError(f"--data '{pair}': use SUITE=PATH, e.g. gpqa_diamond=gpqa.csv")
        make_suite(name.split(".", 1)[0])  # unknown names suggest the closest; SUITE.OPTION
        out[name] = path
    return out


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]), as_json=args.json)
    names = [s.strip() for s in args.suites.split(",") if s.strip()]
    if args.paper:
        if names:
            raise UsageError("--paper runs the paper's table itself: drop --suites")
        if args.responses:
            raise UsageError("--paper generates: re-score one suite with --responses --suites S")
        if not args.out:
            raise UsageError(
                "--paper needs --out DIR: the composite's interval is drawn from the saved samples"
            )
        names = list(PAPER_COLUMNS.values())
    if not names:
        raise UsageError("--suites is empty: name at least one suite, e.g. --suites aime25")
    for name in names:
        make_suite(name)
    from spade_async.config_bounds import check_flag  # the recipe's ranges, the same line

    for flag, key in (("n", "eval.n"), ("limit", "eval.limit"), ("max_tokens", "eval.max_tokens"),
                      ("concurrency", "eval.concurrency"), ("engine_threads", "engine.threads"),
                      ("base_url", "engine.external")):  # fmt: skip
        check_flag(f"--{flag.replace('_', '-')}", key, getattr(args, flag))
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    data = _data(args.data)
    for flag, option in (("user_sim", "user_url"), ("user_sim_model", "user_model")):
        if getattr(args, flag):
            data[f"acebench_agent.{option}"] = getattr(args, flag)
    if args.responses:
        from spade_async.eval.rescore import rescore

        res = anyio.run(rescore, Path(args.responses), names, out, data)
    else:
        if not args.target:
            raise UsageError("name a model or run directory to evaluate (or --responses/--compare)")
        _check_data(names, data)
        res = anyio.run(_generate, args, names, out, data)
    print_table(res)
    record = msgspec.to_builtins(res)
    if args.paper:
        rows = summary(res, out / "results.json")
        print_summary(rows)
        record["paper"] = rows
    if args.json:
        sys.stdout.write(msgspec.json.encode(record).decode() + "\n")
    return 0


def _check_data(names: list[str], data: dict[str, str]) -> None:
    """User-file suites: a missing or malformed file fails before any engine starts."""
    for name in names:
        if name not in SHIPPED:
            make_suite(name, data).load(1)


def _engine_config(target: str, threads: int):
    """A run directory's own engine placement (CPU engines or SGLang), else one CPU engine."""
    from spade_async.engines import EngineConfig

    config = Path(target).expanduser() / "config.toml"
    cfg = EngineConfig()
    if config.is_file() and not (config.parent / "config.json").is_file():
        from spade_async.recipe import load

        cfg = load(config).engine
    return msgspec.structs.replace(cfg, threads=threads) if threads else cfg


async def _generate(args, names: list[str], out: Path | None, data: dict[str, str]) -> Results:
    from spade_async.engines import running_engines
    from spade_async.eval.engine import ClientGenerator, resolve_target
    from spade_async.eval.runner import evaluate
    from spade_async.generation.client import GenerationClient
    from spade_async.models import load_tokenizer

    model_dir, label, version = resolve_target(args.target)
    tokenizer = load_tokenizer(str(model_dir))
    async with contextlib.AsyncExitStack() as stack:
        if args.base_url:
            urls = [args.base_url]
        else:
            logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spade-eval-")))
            engines = await stack.enter_async_context(
                running_engines(_engine_config(args.target, args.engine_threads), model_dir, logs)
            )
            urls = [e.url for e in engines]
        client = await stack.enter_async_context(GenerationClient(urls))
        return await evaluate(
            names, ClientGenerator(client, tokenizer), out=out, model=label, n=args.n,
            limit=args.limit, max_tokens=args.max_tokens, concurrency=args.concurrency,
            data=data, policy_version=version,
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
