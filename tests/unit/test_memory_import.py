"""``spade memory import`` runs every file through the sandboxed validation gates."""

from __future__ import annotations

import json

from spade_async.cli import main as spade
from spade_async.envs.examples import HERE
from spade_async.memory.store import MemoryStore

HOSTILE = {
    "syntax.py": "class BadEnv:\n    def reset(self, seed=None)\n        return 'x', {}\n",
    "exits.py": (
        "import os\n\nclass ExitEnv:\n    def reset(self, seed=None):\n        return 'x', {}\n\n"
        "    def step(self, action):\n        os._exit(3)\n"
    ),
    "hangs.py": (
        "class HangEnv:\n    def reset(self, seed=None):\n        while True:\n            pass\n\n"
        "    def step(self, action):\n        return 'x', 0.0, False, False, {}\n"
    ),
    "wrong_type.py": (
        "class TypeEnv:\n    def reset(self, seed=None):\n        return 42, {}\n\n"
        "    def step(self, action):\n        return 'x', 0.0, False, False, {}\n"
    ),
    "no_class.py": "def reset():\n    return 'x'\n",
}


def test_import_validates_accepts_rejects_and_dedups(tmp_path, capsys):
    src = tmp_path / "pool"
    src.mkdir()
    for name, code in HOSTILE.items():
        (src / name).write_text(code)
    (src / "binary.py").write_bytes(b"\xff\xfe\x00class X: pass\n")
    for name in ("mastermind.py", "fog_maze.py"):
        (src / name).write_bytes((HERE / name).read_bytes())
    # the same environment again with only a comment added: an exact duplicate
    (src / "mastermind_copy.py").write_bytes(b"# copied\n" + (HERE / "mastermind.py").read_bytes())
    run = tmp_path / "run"
    assert spade(["memory", "import", str(src), "--run", str(run), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {"accepted": 2, "rejected": 6, "duplicate": 1, "skipped": 0}
    lines = {line.split()[1].rstrip(":"): line for line in out.err.splitlines()}
    assert "syntax" in lines[str(src / "syntax.py")]
    assert "crash" in lines[str(src / "exits.py")]
    assert "timeout" in lines[str(src / "hangs.py")]
    assert "not UTF-8" in lines[str(src / "binary.py")]
    assert "reset" in lines[str(src / "wrong_type.py")]
    with MemoryStore(run / "memory.lmdb", readonly=True) as store:
        recs = list(store.records())
        assert len(recs) == 8
        bad = [r for r in recs if not r.valid]
        assert len(bad) == 6 and all(r.reason and r.stage != "ok" for r in bad)
        good = {r.env_class: r for r in recs if r.valid}
        assert set(good) == {"MastermindEnv", "FogMazeEnv"}
        assert good["MastermindEnv"].skill == "Logical_Deduction"  # from the bundled table
        assert good["MastermindEnv"].exact_repeats == 1
        assert good["FogMazeEnv"].origin.kind == "import"
        assert store.check_consistency() == []


def test_import_missing_source_is_one_line(tmp_path, capsys):
    assert spade(["memory", "import", str(tmp_path / "nope"), "--run", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist" in err and len(err.splitlines()) == 1


def test_import_shares_the_callers_pool_and_writer(tmp_path):
    import anyio

    from spade_async.envs.pool import EnvPool
    from spade_async.memory.importer import import_files
    from spade_async.memory.writer import MemoryWriter

    async def main(store):
        writer = MemoryWriter(store)
        async with EnvPool() as pool, anyio.create_task_group() as tg:
            await tg.start(writer.run)
            first = await import_files(store, HERE / "mastermind.py", pool=pool, writer=writer)
            again = await import_files(store, HERE / "mastermind.py", pool=pool, writer=writer)
            writer.close()
        return first, again, writer.committed

    with MemoryStore(tmp_path / "m") as store:
        first, again, committed = anyio.run(main, store)
        assert [o.outcome for o in first + again] == ["accepted", "duplicate"]
        assert committed == 2 and store.stats()["total"] == 1
