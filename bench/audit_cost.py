"""Audits inside training: their cost in environment calls and engine calls, and false
quarantines, by ``audit.share``.

    python bench/audit_cost.py [--quick] [--save]

The loop's own play step (``loop/cycle.play``) over the bundled examples and the demo games
in the real sandboxed pool, with an engine stand-in (random boxed replies after a short
"generation" wait, counted), for each share: every environment's group of ``slots``
no-hint plays, ``steps`` times. Measured per share: environment calls (the pool's counter)
against share 0 (today), engine calls made by scripted plays (engine calls minus the real
plays' turns: 0 by construction), audits run, environments quarantined (every environment
here is honest: each one is a false quarantine), and the real plays given up (the slots
audits take).

Targets (issue 40): at the default share, at most 8 % more environment calls than share 0,
0 engine calls by audits, 0 false quarantines. The last line printed is one JSON object;
``--save`` writes ``bench/results/audit_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import anyio
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _hw import machine  # noqa: E402

from spade_async import recipe  # noqa: E402
from spade_async.envs.audit import AuditConfig  # noqa: E402
from spade_async.envs.pool import EnvPool, PoolConfig  # noqa: E402
from spade_async.generation.client import GenerateResult  # noqa: E402
from spade_async.loop import cycle  # noqa: E402
from spade_async.loop.runtime import ControllerState  # noqa: E402
from spade_async.memory.records import Origin, make_record  # noqa: E402
from spade_async.memory.store import MemoryStore  # noqa: E402
from spade_async.memory.writer import MemoryWriter  # noqa: E402
from spade_async.models import tokenizer_dir  # noqa: E402
from spade_async.telemetry.metrics import Meters  # noqa: E402

ENVS = sorted((ROOT / "spade_async" / "envs" / "examples").glob("[a-z]*.py")) + sorted(
    (ROOT / "configs" / "demo-envs").glob("*.py")
)


class _Engine:
    """Random boxed replies (words, numbers, letters) after ``gap`` seconds; counts calls."""

    def __init__(self, seed: int, gap: float) -> None:
        self.rng, self.gap, self.calls = random.Random(seed), gap, 0

    async def generate(self, input_ids, sampling, **kw):
        self.calls += 1
        await anyio.sleep(self.gap)
        r = self.rng
        text = r.choice((
            f"\\boxed{{{r.randint(0, 20)}}}",
            f"\\boxed{{{r.choice('abcdefghij')}}}",
            f"I think \\boxed{{{r.choice(('up', 'left', 'open', 'guess'))} {r.randint(0, 9)}}}",
            "Not sure yet.",
        ))  # fmt: skip
        return GenerateResult(
            output_ids=[5, 6], logprobs=[-0.1, -0.2], finish_reason="stop", matched=None,
            text=text, weight_version="0", prompt_tokens=len(input_ids), url="fake",
        )  # fmt: skip

    def end_session(self, key):
        pass


class _Tel:
    def event(self, step, message, level="info"):
        print(f"  event: {message}", file=sys.stderr)


def _setting(path: Path) -> str:
    return "tool_use" if path.stem.endswith("_tool") else "games"


async def _one(share: float, paths: list[Path], slots: int, steps: int, turns: int, gap: float,
               tok) -> dict:  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        cfg = recipe.load(None, [
            f"agent.max_turns={turns}", "agent.plays_hint=0", "agent.max_turn_tokens=8",
            "max_concurrent_episodes=16", "telemetry.replay_records=0.0",
            f"audit.share={share}", f"audit.min_per_group={1 if share > 0 else 0}",
        ])  # fmt: skip
        async with EnvPool(PoolConfig(max_workers=8, prewarm=1)) as pool:
            with MemoryStore(Path(tmp) / "memory.lmdb") as store:
                writer = MemoryWriter(store)
                async with anyio.create_task_group() as tg:
                    await tg.start(writer.run)
                    recs = []
                    for p in paths:
                        rec = make_record(p.read_text(), origin=Origin(kind="pool"), valid=True,
                                          stage="ok", skill="bench", setting=_setting(p))  # fmt: skip
                        await writer.put(rec)
                        recs.append(rec)
                    rt = SimpleNamespace(
                        cfg=cfg, pool=pool, store=store, writer=writer, tokenizer=tok,
                        client=_Engine(0, gap), meters=Meters(), tel=_Tel(),
                        state=ControllerState(), rng=np.random.default_rng(0),
                        run_dir=SimpleNamespace(root=Path(tmp)),
                    )  # fmt: skip
                    envs = cycle.env_refs(rt, [r.id for r in recs])
                    calls0, episodes = pool.counters["calls"], []
                    for s in range(steps):
                        rt.state.step = s
                        episodes += await cycle.play(rt, envs, {}, 0, slots)
                    calls = pool.counters["calls"] - calls0
                    writer.close()
                    tg.cancel_scope.cancel()
                quarantined = [r.id[:12] for r in recs if store.get(r.id).quarantine]
    snap = rt.meters.snapshot()
    real_turns = sum(e.turns for e in episodes)
    return {
        "share": share,
        "env_calls": calls,
        "audit_env_calls": snap.get("audit/env_calls", 0),
        "engine_calls_by_audits": rt.client.calls - real_turns,
        "audits_run": snap.get("audit/run", 0),
        "audits_by_kind": {k: snap.get(f"audit/run/{k}", 0) for k in ("solution", "garbage")},
        "audits_skipped": snap.get("audit/skipped", 0),
        "quarantined": quarantined,
        "real_plays": len(episodes),
        "slots": len(envs) * slots * steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="6 environments, 8 slots, 2 steps")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    default = AuditConfig().share
    if args.quick:
        paths, slots, steps, turns, gap = ENVS[:6], 8, 2, 6, 0.02
        shares = [0.0, default]
    else:  # the GPU recipes' group: 16 no-hint slots
        paths, slots, steps, turns, gap = ENVS, 16, 3, 10, 0.05
        shares = [0.0, default, 0.125, 0.25]
    tok = __import__("transformers").AutoTokenizer.from_pretrained(
        tokenizer_dir("smollm2-135m-instruct")
    )
    rows = [anyio.run(_one, s, paths, slots, steps, turns, gap, tok) for s in shares]
    base = rows[0]["env_calls"]
    for r in rows:
        r["extra_env_calls_pct"] = round(100 * (r["env_calls"] / base - 1), 2)
        r["real_plays_given_up_pct"] = round(100 * (1 - r["real_plays"] / r["slots"]), 2)
        print(json.dumps(r), file=sys.stderr)
    d = next(r for r in rows if r["share"] == default)
    out = {
        "hardware": machine(),
        "setup": {
            "environments": len(paths),
            "slots_per_group": slots,
            "steps": steps,
            "max_turns": turns,
            "engine_gap_s": gap,
            "shares": shares,
        },  # fmt: skip
        "rows": rows,
        "targets": {
            "extra_env_calls_pct_at_default": {
                "target": "<= 8",
                "measured": d["extra_env_calls_pct"],
                "met": d["extra_env_calls_pct"] <= 8,
            },
            "engine_calls_by_audits": {
                "target": 0,
                "measured": d["engine_calls_by_audits"],
                "met": all(r["engine_calls_by_audits"] == 0 for r in rows),
            },
            "false_quarantines": {
                "target": 0,
                "measured": sum(len(r["quarantined"]) for r in rows),
                "met": not any(r["quarantined"] for r in rows),
            },
        },  # fmt: skip
    }
    if args.save:
        res = HERE / "results"
        res.mkdir(exist_ok=True)
        (res / "audit_cost.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
