"""Environment memory and corpus sampling throughput.

    python bench/memory.py [--quick] [--save]

Memory (``memory.lmdb``): record writes/s batched (one durable transaction per 512 puts,
the MemoryWriter's batching) and one per transaction; the per-record prepare cost (id by
normalised-code sha256 + MinHash signature, done off the writer); stats updates/s; point
reads/s; designer-context sampling latency (spade rule, recent, diverse) and PLR replay
latency at 1k, 10k and 100k records (``--sizes`` for others, e.g. 1000,100000,1000000).
Headline: what memory costs one policy step at the recipe's load (configs/qwen3-8b-games.toml:
new records, stats updates and designer contexts per step, at the measured per-operation
costs) as a share of a 150 s step, beside the reference SPADE's real workload (its JSON
memory, capped at 200 records, saved once per regeneration; contexts by scanning it).
Supplementary: a JSON-file FIFO updated the reference's way but grown to our sizes.

Corpus: a generated JSONL file (1 GB; 100 MB with --quick) indexed once, then documents
sampled uniformly, in a child process whose peak RSS is reported.
The last line printed is one JSON object; ``--save`` writes bench/results/memory.json.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _hw import emit, int_list, machine

from spade_async.memory import sampling
from spade_async.memory.ops import PutOp, StatsOp, prepare_signature
from spade_async.memory.records import EnvRecord, Origin, Stats, make_record
from spade_async.memory.store import MemoryConfig, MemoryStore

SKILLS = [
    "Mathematical_Reasoning",
    "Logical_Deduction",
    "Spatial_Reasoning",
    "Pattern_Recognition",
    "Optimization",
    "Causal_Inference",
]
WORDS = (
    "state turn reward action hidden guess clue grid cell score target value board move "
    "seed rng parse limit check done step reset hint level"
).split()


def hardware() -> dict:
    return {
        **machine(),
        "platform": platform.platform(),
        "storage": "memory.lmdb in " + tempfile.gettempdir(),
    }


def synth_source(i: int, lines: int = 70) -> str:
    """A ~3 KB environment-shaped file, different enough per ``i`` not to be a near-dup."""
    rng = random.Random(i)
    body = [
        f"        self.{rng.choice(WORDS)}_{j} = {rng.randint(0, 10**9)}  # {rng.choice(WORDS)}"
        for j in range(lines)
    ]
    return (
        f"import random\n\nclass Synth{i}Env:\n    def reset(self, seed=None):\n"
        + "\n".join(body)
        + f"\n        return 'synth {i}', {{}}\n\n"
        "    def step(self, action):\n        return 'ok', 0.0, False, False, {}\n"
    )


_BODY = "\n".join(f"        self.{w}_{j} = {{i}} * {j} + {{j}}" for j, w in enumerate(WORDS * 2))


def fill_source(i: int) -> bytes:
    """A cheap ~1 KB per-record variant for bulk fills (the fill is not what is timed)."""
    return (
        f"class Fill{i}Env:\n    def reset(self, seed=None):\n"
        + _BODY.format(i=i, j=i % 97)
        + "\n        return 'x', {}\n"
    ).encode()


def timed(fn, n: int) -> tuple[list[float], list[float]]:
    """(wall ms, CPU ms of this thread) per call: CPU time is immune to preemption by other
    processes on a shared machine, wall time is what a caller waits."""
    wall, cpu = [], []
    for _ in range(n):
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append((time.thread_time() - c) * 1e3)
        wall.append((time.perf_counter() - t) * 1e3)
    return wall, cpu


def pct(ms: list[float], q: float) -> float:
    ms = sorted(ms)
    return round(ms[min(len(ms) - 1, int(len(ms) * q))], 4)


def lat(times: tuple[list[float], list[float]]) -> dict:
    wall, cpu = times
    return {
        "median_ms": pct(wall, 0.5),
        "p99_ms": pct(wall, 0.99),
        "cpu_median_ms": pct(cpu, 0.5),
        "cpu_p99_ms": pct(cpu, 0.99),
    }


def write_rates(root: Path, n: int) -> dict:
    sources = [synth_source(i) for i in range(n)]
    t = time.perf_counter()
    recs = [
        make_record(
            sources[i],
            origin=Origin(kind="designer", policy_version=0),
            valid=True,
            stage="ok",
            skill=SKILLS[i % 6],
        )
        for i in range(n)
    ]
    cfg = MemoryConfig()
    sigs = [prepare_signature(r, cfg.num_perm, cfg.shingle_tokens) for r in recs]
    prepare = n / (time.perf_counter() - t)
    with MemoryStore(root / "writes") as store:
        t, c = time.perf_counter(), time.process_time()
        for k in range(0, n, cfg.max_batch):
            store.apply(
                [
                    PutOp(record=r, signature=s)
                    for r, s in zip(
                        recs[k : k + cfg.max_batch], sigs[k : k + cfg.max_batch], strict=True
                    )
                ]
            )
        batched = n / (time.perf_counter() - t)
        batched_cpu = n / (time.process_time() - c)
        extra = [
            make_record(
                synth_source(n + i),
                origin=Origin(kind="designer"),
                valid=True,
                stage="ok",
                skill="X",
            )
            for i in range(100)
        ]
        t = time.perf_counter()
        for r in extra:
            store.put(r, prepare_signature(r, cfg.num_perm, cfg.shingle_tokens))
        single = 100 / (time.perf_counter() - t)
        ids = [r.id for r in recs]
        pick = random.Random(0).choices(ids, k=20000)
        t = time.perf_counter()
        with store.read() as txn:
            for i in pick:
                store.get(i, txn)
        reads = len(pick) / (time.perf_counter() - t)
        assert store.stats()["duplicates"] == 0
    return {
        "records": n,
        "prepare_per_s_one_core": round(prepare),
        "writes_per_s_batched": round(batched),
        "writes_per_cpu_s_batched": round(batched_cpu),
        "writes_per_s_one_per_txn": round(single),
        "point_reads_per_s": round(reads),
    }


def fill(store: MemoryStore, n: int, rng: np.random.Generator) -> list[str]:
    """``n`` records with varied stats; built directly (sha256 id, random MinHash) for speed."""
    ids = []
    batch = []
    for i in range(n):
        src = fill_source(i)
        rid = hashlib.sha256(src).hexdigest()
        plays = 16
        wins = int(rng.integers(0, 17))
        st = Stats(
            plays_nohint=plays,
            wins_nohint=wins,
            plays_hint=plays,
            wins_hint=min(16, wins + int(rng.integers(0, 6))),
            regret_sum=float(rng.random() * 0.5),
            regret_updates=1,
            first_version=i // 100,
            last_version=i // 100,
        )
        rec = EnvRecord(
            id=rid,
            source=src,
            skill=SKILLS[i % 6],
            env_class=f"Synth{i}Env",
            origin=Origin(kind="designer", policy_version=i // 100),
            valid=True,
            stage="ok",
            stats=st,
            created_at=1e9 + i,
        )
        sig = rng.integers(0, 2**32, size=store.config.num_perm, dtype=np.uint32).tobytes()
        batch.append(PutOp(record=rec, signature=sig))
        ids.append(rid)
        if len(batch) == 2000:
            store.apply(batch)
            batch = []
    if batch:
        store.apply(batch)
    return ids


class JsonFifo:
    """The reference's memory: a list of dicts, the whole file rewritten on every update."""

    def __init__(self, path: Path, n: int, rng: np.random.Generator):
        self.path = path
        self.items = [
            {
                "code": synth_source(i, lines=20)[:2000],
                "skill": SKILLS[i % 6],
                "win_rate": float(rng.random()),
                "regret": float(rng.random() * 0.5),
            }
            for i in range(n)
        ]

    def update(self, i: int, win_rate: float, regret: float) -> None:
        self.items[i].update(win_rate=win_rate, regret=regret)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(self.items, f)
        os.replace(tmp, self.path)

    def context(self, skill: str) -> list[dict]:
        pos = [m for m in self.items if m["skill"] == skill and 0.15 <= m["win_rate"] <= 0.85]
        pos.sort(key=lambda m: -m["regret"])
        neg = [m for m in self.items if m["skill"] == skill and not 0.1 <= m["win_rate"] <= 0.9]
        return pos[:2] + neg[:1]


def at_size(root: Path, n: int, quick: bool) -> dict:
    rng = np.random.default_rng(n)
    out: dict = {"records": n}
    with MemoryStore(root / f"m{n}") as store:
        t = time.perf_counter()
        ids = fill(store, n, rng)
        out["fill_s"] = round(time.perf_counter() - t, 2)
        gc.collect()
        gc.freeze()  # the fill's objects: keep the collector out of the timings
        k = 200 if quick else 1000
        r = np.random.default_rng(0)
        for strategy in ("spade", "recent", "diverse"):
            out[f"context_{strategy}"] = lat(
                timed(
                    lambda s=strategy: sampling.designer_context(
                        store, SKILLS[int(r.integers(6))], strategy=s, rng=r
                    ),
                    k,
                )
            )
        out["replay_plr_after_commit"] = lat(
            timed(
                lambda: (
                    store.cache.clear(),
                    sampling.replay_sample(store, 8, version=n // 100 + 5, rng=r),
                ),
                k,
            )
        )
        out["replay_plr"] = lat(
            timed(lambda: sampling.replay_sample(store, 8, version=n // 100 + 5, rng=r), k)
        )
        m = 2000
        ops = [
            StatsOp(
                env_id=ids[int(i)],
                plays_nohint=16,
                wins_nohint=8,
                plays_hint=16,
                wins_hint=12,
                regret=0.25,
                version=n,
            )
            for i in r.integers(0, n, m)
        ]
        t = time.perf_counter()
        for j in range(0, m, 512):
            store.apply(ops[j : j + 512])
        out["stats_updates_per_s_batched"] = round(m / (time.perf_counter() - t))
        t = time.perf_counter()
        for op in ops[:100]:
            store.apply([op])
        out["stats_updates_per_s_one_per_txn"] = round(100 / (time.perf_counter() - t))
        out["consistent"] = None if n > 10_000 else store.check_consistency() == []
    if n > (10_000 if quick else 100_000):
        out["json_fifo"] = (
            "skipped: above 100k records (10k with --quick) one rewrite takes minutes"
        )
        return out
    fifo = JsonFifo(root / f"fifo{n}.json", n, rng)
    reps = max(2, min(50, 200_000 // n))
    t = time.perf_counter()
    for j in range(reps):
        fifo.update(j % n, 0.5, 0.1)
    out["json_fifo_updates_per_s"] = round(reps / (time.perf_counter() - t), 2)
    out["json_fifo_context"] = lat(
        timed(lambda: fifo.context(SKILLS[0]), max(3, min(200, 2_000_000 // n)))
    )
    out["speedup_updates_batched_vs_json_fifo"] = round(
        out["stats_updates_per_s_batched"] / out["json_fifo_updates_per_s"], 1
    )
    out["speedup_updates_one_per_txn_vs_json_fifo"] = round(
        out["stats_updates_per_s_one_per_txn"] / out["json_fifo_updates_per_s"], 1
    )
    return out


RECIPE = Path(__file__).resolve().parents[1] / "configs" / "qwen3-8b-games.toml"
STEP_S = 150.0  # the recipe's rough step (its header: engines and trainer ~2-3 min each)


def recipe_load() -> dict:
    """Memory operations per policy step at the recipe's scale (configs/qwen3-8b-games.toml)."""
    from spade_async import recipe

    cfg = recipe.load(str(RECIPE), [])
    d = cfg.designer
    prompts = d.skills_per_regen * d.prompts_per_skill  # one designer context per prompt
    envs = prompts * d.samples_per_prompt  # new records per regeneration
    return {
        "recipe": RECIPE.name,
        "regen_interval": cfg.regen_interval,
        "new_records_per_step": envs / cfg.regen_interval,
        "contexts_per_step": prompts / cfg.regen_interval,
        "stats_updates_per_step": envs,  # every environment of the window, once per step
        "context_strategy": getattr(d, "context", "spade"),
        "step_s": STEP_S,
    }


def reference_workload(root: Path, load: dict, cap: int = 200) -> dict:
    """The reference SPADE's memory: a JSON list of at most ``cap`` records, written once
    per regeneration, the designer's examples picked by scanning it."""
    rng = np.random.default_rng(7)
    fifo = JsonFifo(root / "reference200.json", cap, rng)
    save = lat(timed(lambda: fifo.update(0, 0.5, 0.1), 50))
    ctx = lat(timed(lambda: fifo.context(SKILLS[0]), 500))
    per_step = (
        save["median_ms"] / load["regen_interval"] + ctx["median_ms"] * load["contexts_per_step"]
    )
    return {"records": cap, "save_once": save, "context": ctx, "per_step_ms": round(per_step, 4)}


def per_step(size: dict, writes: dict, load: dict) -> dict:
    """What memory costs one policy step at this size: the recipe's writes, stats updates
    and designer contexts at the measured per-operation costs (median), and its share."""
    write_ms = 1e3 / writes["writes_per_s_batched"] + 1e3 / writes["prepare_per_s_one_core"]
    parts = {
        "new_records_ms": load["new_records_per_step"] * write_ms,
        "stats_updates_ms": load["stats_updates_per_step"] * 1e3 / size["stats_updates_per_s_batched"],
        "contexts_ms": load["contexts_per_step"] * size[f"context_{load['context_strategy']}"]["median_ms"],
    }  # fmt: skip
    total = sum(parts.values())
    return {
        **{k: round(v, 3) for k, v in parts.items()},
        "total_ms": round(total, 3),
        "share_of_step": round(total / 1e3 / load["step_s"], 7),
    }


CHILD = r"""
import json, sys, time
from spade_async.corpus import open_corpus

def peak_rss_mb():  # VmHWM: this process's own high-water mark (ru_maxrss survives exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)

t = time.perf_counter(); c = open_corpus(sys.argv[1]); index_s = time.perf_counter() - t
c.close()
t = time.perf_counter(); c = open_corpus(sys.argv[1]); cached_s = time.perf_counter() - t
n = int(sys.argv[2]); t = time.perf_counter(); docs = c.sample(n, seed=0)
dt = time.perf_counter() - t
print(json.dumps({"documents": len(c), "index_build_s": round(index_s, 2),
  "open_cached_ms": round(cached_s * 1e3, 2), "docs_sampled": n,
  "docs_per_s": round(n / dt), "mb_per_s_sampled": round(sum(len(d.text) for d in docs) / dt / 1e6, 1),
  "peak_rss_mb": peak_rss_mb()}))
"""


def corpus(root: Path, size_mb: int) -> dict:
    path = root / "corpus.jsonl"
    rng = np.random.default_rng(0)
    vocab = np.array([f"{w}{k}" for w in WORDS for k in range(40)])
    texts = [" ".join(row) for row in vocab[rng.integers(0, len(vocab), size=(64, 700))]]
    t = time.perf_counter()
    written, i = 0, 0
    with open(path, "wb") as f:
        while written < size_mb << 20:
            chunk = b"".join(
                json.dumps({"id": f"doc-{i + j}", "text": texts[(i + j) % 64]}).encode() + b"\n"
                for j in range(4096)
            )
            f.write(chunk)
            written += len(chunk)
            i += 4096
    gen_s = time.perf_counter() - t
    env = os.environ | {"SPADE_CACHE": str(root / "cache")}
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "2000"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return {"file_mb": round(written / 2**20), "generate_s": round(gen_s, 1), **out}


def repair_scan(root: Path, quick: bool) -> dict:
    """Plain ``spade memory verify`` on a store whose values are crafted to look like
    pages (issue 45): records whose code is leaf pages, every node naming a 1 MB run (read
    as pages, each node would decode the whole run). Reports the wall time of ``verify``
    and the scan's work (bytes examined) per byte of file: linear means a small constant."""
    import struct

    from spade_async.memory import repair

    path, psize = root / "crafted" / "memory.lmdb", 4096
    key = b"a" * 64
    node = struct.pack("<HHHH", 0, 16, 1, 64) + key + struct.pack("<Q", 2)  # 1 MB at page 2
    per = (psize - 16) // (len(node) + 2)
    page = bytearray(psize)
    upper = psize - per * len(node)
    struct.pack_into("<QHHHH", page, 0, 0, 0, 2, 16 + 2 * per, upper)
    for i in range(per):
        struct.pack_into("<H", page, 16 + 2 * i, upper + i * len(node))
        page[upper + i * len(node) : upper + (i + 1) * len(node)] = node
    n_records, pages_each = (4, 256) if quick else (16, 512)
    from spade_async.memory.records import encode

    def crafted(r: int, pad: int):
        body = f"CRAFTED = {r}\n#{' ' * pad}\n".encode() + bytes(page) * pages_each
        return make_record(body, origin=Origin(kind="import"), valid=True, stage="ok",
                           skill="crafted")  # fmt: skip

    with MemoryStore(path) as store:
        for r in range(n_records):  # the pages on page boundaries of the file
            at = 16 + encode(crafted(r, 0)).index(bytes(page))
            store.put(crafted(r, -at % psize))
    data = (path / "data.mdb").read_bytes()
    t = time.perf_counter()
    report = repair.verify(path)
    verify_s = time.perf_counter() - t
    t = time.perf_counter()
    found, pages = repair.scan_image(data)
    scan_s = time.perf_counter() - t
    return {"file_mb": round(len(data) / 2**20, 2), "records": len(found),
            "damage": report["damage"], "verify_s": round(verify_s, 3),
            "scan_s": round(scan_s, 3), "work_per_byte": round(pages.work / len(data), 3),
            "mb_per_s": round(len(data) / 2**20 / scan_s, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (under a minute)")
    ap.add_argument("--save", action="store_true", help="write bench/results/memory.json")
    ap.add_argument(
        "--sizes", default="", help="record counts, comma separated (default 1000,10000,100000)"
    )
    args = ap.parse_args()
    q = args.quick
    sizes = int_list(args.sizes, "--sizes") if args.sizes else [1_000, 10_000, 100_000]
    with tempfile.TemporaryDirectory(prefix="spade-bench-memory-") as tmp:
        root = Path(tmp)
        out: dict = {"name": "memory", "quick": q, "hardware": hardware()}
        size_mb = 100 if q else 1024
        out["corpus"] = corpus(root, size_mb)  # first, before this process grows
        out["corpus"]["note"] = f"generated JSONL of {size_mb} MB" + (
            " (--quick; the full run uses 1 GB)" if q else ""
        )
        out["writes"] = write_rates(root, 2000 if q else 10_000)
        out["repair_scan"] = repair_scan(root, q)
        out["sizes"] = [at_size(root, n, q) for n in sizes]
        load = recipe_load()
        out["per_step"] = {"load": load, "reference": reference_workload(root, load)}
        for size in out["sizes"]:
            out["per_step"][f"records_{size['records']}"] = per_step(size, out["writes"], load)
    big = out["sizes"][-1]
    largest = big["records"]
    step_big = out["per_step"][f"records_{largest}"]
    out["targets"] = {
        "writes_per_s_batched": {
            "target": ">= 5000",
            "measured": out["writes"]["writes_per_s_batched"],
            "per_cpu_second": out["writes"]["writes_per_cpu_s_batched"],
            "met": out["writes"]["writes_per_s_batched"] >= 5000,
        },
        f"memory_share_of_step_at_{largest}": {
            "target": f"<= 0.01 (1% of a {STEP_S:.0f} s step at the recipe's load)",
            "measured": step_big["share_of_step"],
            "per_step_ms": step_big["total_ms"],
            "reference_per_step_ms": out["per_step"]["reference"]["per_step_ms"],
            "met": step_big["share_of_step"] <= 0.01,
        },
        **{
            f"{name}_ms_at_{largest}": {
                "target": "<= 2 (median; p99 of CPU time too)",
                "measured": big[name]["median_ms"],
                "cpu_p99_ms": big[name]["cpu_p99_ms"],
                "wall_p99_ms": big[name]["p99_ms"],
                "met": big[name]["median_ms"] <= 2.0 and big[name]["cpu_p99_ms"] <= 2.0,
            }
            for name in (
                "context_spade",
                "context_recent",
                "context_diverse",
                "replay_plr_after_commit",
            )
        },
        "repair_scan_work_per_byte": {
            "target": "<= 3 (plain verify's scan linear in file size on crafted values)",
            "measured": out["repair_scan"]["work_per_byte"],
            "verify_s": out["repair_scan"]["verify_s"],
            "file_mb": out["repair_scan"]["file_mb"],
            "met": out["repair_scan"]["work_per_byte"] <= 3
            and out["repair_scan"]["records"] == (4 if q else 16),
        },
        "corpus_peak_rss_mb": {
            "target": "<= 256 MB whatever the corpus size (sampling never loads the corpus)",
            "measured": out["corpus"]["peak_rss_mb"],
            "corpus_mb": out["corpus"]["file_mb"],
            "met": out["corpus"]["peak_rss_mb"] <= 256,
        },
    }
    emit(out, "memory", args.save)


if __name__ == "__main__":
    main()
