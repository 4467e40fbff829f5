"""The controller's CPU at scale, before and after a change: two trees side by side.

``before``: the ``BASE`` commit's tree (``git archive``; the working tree is not touched);
``after``: the same tree with each ``COMMIT``'s own diff applied in order, so that only
those commits differ (other work committed in between, which may change the workload, is
left out). Each runs ``bench/simulate.py``'s 8B games run at the paper's scale
(``at_scale``: 24 environments x 16+16 plays, the real tokenizer in the path) for
``--steps`` steps, the two at the same time, so that both see the same contention on a
shared machine (CPU time measured under load reads higher; run one after the other, the
load moves between them). Each run
reports its loop CPU a step and the real tokenizer's CPU by kind and caller (hooks on
``sim/parts.RealTokenizerInPath``, the same in both trees), ``--rounds`` times.

    python bench/scale_ab.py BASE COMMIT [COMMIT ...] [--steps 2] [--rounds 2] [--quick] [--save] [--name NAME]

--quick: one round of one step. The last line printed is one JSON object: hardware, the
command, each round's two runs and its loop CPU a step after over before, and the target
(after no worse than before). With no commits named: issue 41's controller change.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _hw import machine

ROOT = Path(__file__).resolve().parents[1]
# issue 41's controller change: encoding on the tokenizer's backend, the end-of-turn tail
# cached, route decoding in one pass, engine URLs parsed once, the simulated engines' CPU
# timed whole, the tokenizer's CPU counted by caller
BASE = "b9c3993"
CHANGE = ("06b6c28", "64e43ff", "69e3d9d", "6d3fcad", "457598e", "01fe2dd")

# run inside a tree: its own at_scale, with the tokenizer's CPU counted by kind and caller
RUNNER = r"""
import collections, json, sys, time
root, steps = sys.argv[1], int(sys.argv[2])
sys.path[:0] = [root + "/bench", root]
import simulate as S
from spade_async.sim import parts
log = collections.defaultdict(lambda: [0, 0.0])
SKIP = {"_encode", "encode_ids", "render_text", "render_prompt", "_render"}
def hook(name, kind):
    orig = getattr(parts.RealTokenizerInPath, name)
    def timed(self, *a, **k):
        f = sys._getframe(1)
        while f.f_code.co_name in SKIP:
            f = f.f_back
        c0 = time.process_time()
        try:
            return orig(self, *a, **k)
        finally:
            e = log[kind + "/" + f.f_code.co_name]
            e[0] += 1
            e[1] += time.process_time() - c0
    setattr(parts.RealTokenizerInPath, name, timed)
hook("__call__", "encode")
hook("apply_chat_template", "render")
hook("decode", "decode")
r = S.at_scale(S.RECIPE_8B, steps, S.PAPER_SCALE)
out = {k: r[k] for k in ("steps", "loop_cpu_s_per_step", "process_cpu_s_per_step", "episodes",
                         "load_avg_1m", "decoded_tokens")}
out["tokenizer"] = {k: {"s": round(d / steps, 3), "calls": round(n / steps)}
                    for k, (n, d) in sorted(log.items(), key=lambda kv: -kv[1][1]) if n}
print(json.dumps(out))
"""


def git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout


def tree(base: str, into: Path, commits: list[str] = ()) -> Path:
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=git("archive", base), check=True)
    for c in commits:
        patch = git("diff", "--binary", f"{c}^", c)
        got = subprocess.run(["git", "apply", "-"], input=patch, cwd=into, capture_output=True)
        if got.returncode:
            sys.exit(f"commit {c} does not apply on {base}: {got.stderr.decode().strip()}")
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("base", nargs="?", default=BASE, help="the commit before the change")
    ap.add_argument("commits", nargs="*", default=list(CHANGE),
                    help="the change: commits applied on base, in order (default: issue 41's "
                    "controller encoding change)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one round of one step")
    ap.add_argument(
        "--save", action="store_true", help="write bench/results/simulate_scale_ab.json"
    )
    ap.add_argument("--name", default="simulate_scale_ab",
                    help="--save writes bench/results/NAME.json (another change: another name)")  # fmt: skip
    args = ap.parse_args()
    if not re.fullmatch(r"[\w-]+", args.name):
        sys.exit(f"--name {args.name!r}: letters, digits, _ and - only (a file in bench/results)")
    steps, rounds = (1, 1) if args.quick else (args.steps, args.rounds)
    shas = []
    for ref in [args.base, *args.commits]:
        got = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref],
                             capture_output=True, text=True)  # fmt: skip
        if got.returncode:
            sys.exit(f"{ref!r} is not a commit here: name one (git log --oneline)")
        shas.append(got.stdout.strip())
    out_rounds = []
    with tempfile.TemporaryDirectory(prefix="spade-scale-ab-") as tmp:
        trees = {"before": tree(shas[0], Path(tmp) / "before"),
                 "after": tree(shas[0], Path(tmp) / "after", shas[1:])}  # fmt: skip
        for _ in range(rounds):
            procs = {n: subprocess.Popen([sys.executable, "-c", RUNNER, str(t), str(steps)],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True)  # fmt: skip
                     for n, t in trees.items()}  # fmt: skip
            runs = {}
            for n, p in procs.items():
                text, _ = p.communicate()
                if p.returncode:
                    sys.exit(f"the {n} run failed (exit {p.returncode})")
                runs[n] = json.loads(text.strip().splitlines()[-1])
            runs["loop_after_over_before"] = round(
                runs["after"]["loop_cpu_s_per_step"] / runs["before"]["loop_cpu_s_per_step"], 3
            )
            out_rounds.append(runs)
            print(json.dumps(runs), file=sys.stderr, flush=True)
    out = {
        "bench": "scale_ab",
        "command": f"python bench/scale_ab.py {' '.join(shas)}"
        + (" --quick" if args.quick else f" --steps {steps} --rounds {rounds}")
        + (" --save" if args.save else "")
        + (f" --name {args.name}" if args.name != "simulate_scale_ab" else ""),
        "hardware": machine(),
        "base": shas[0],
        "applied": shas[1:],
        "rounds": out_rounds,
        "targets": {
            "loop_cpu_not_worse": {
                "target": "after's loop CPU a step <= before's, each round (same load)",
                "measured": [r["loop_after_over_before"] for r in out_rounds],
                "met": all(r["loop_after_over_before"] <= 1.0 for r in out_rounds),
            }
        },
    }
    if args.save:
        (ROOT / "bench" / "results" / f"{args.name}.json").write_text(
            json.dumps(out, indent=2) + "\n"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
