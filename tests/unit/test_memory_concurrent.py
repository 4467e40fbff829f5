"""A reader in one process keeps working while a writer in another grows the map."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_memory_helpers import record

from spade_async.memory.store import MemoryConfig, MemoryStore

WRITER = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_memory_helpers import record
from spade_async.memory.ops import PutOp
from spade_async.memory.store import MemoryConfig, MemoryStore

with MemoryStore(sys.argv[1], MemoryConfig(initial_map_mib=1)) as store:
    for start in range(1, 1201, 300):
        store.apply([PutOp(record=record(i)) for i in range(start, start + 300)])
    print(store.env.info()["map_size"])
"""


def test_reader_survives_map_growth_by_another_process(tmp_path):
    path = tmp_path / "memory.lmdb"
    with MemoryStore(path, MemoryConfig(initial_map_mib=1)) as store:
        store.put(record(0))
    reader = MemoryStore(path, MemoryConfig(initial_map_mib=1), readonly=True)
    try:
        assert reader.stats()["total"] == 1
        out = subprocess.run(
            [sys.executable, "-c", WRITER, str(path)],
            capture_output=True,
            text=True,
            timeout=110,
            check=True,
        )
        assert int(out.stdout) > 1 << 20  # the writer grew the map
        assert reader.stats()["total"] == 1201
        assert reader.get(record(1200).id).skill == "Logical_Deduction"
        assert reader.check_consistency() == []
    finally:
        reader.close()
