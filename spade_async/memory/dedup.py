"""Near-duplicate detection: datasketch MinHash over code-token shingles, LSH bands in LMDB.

``signature(code)`` is a MinHash (datasketch, ``affine32`` scheme, crc32 as the shingle
hash so signatures are stable across processes) over k-token shingles of the normalised
code. Banding parameters (b bands of r rows) come from datasketch's ``MinHashLSH`` for the
configured threshold; the bands themselves live in an LMDB dupsort table (band key ->
record ids), so the index is persisted with the records and opening a store with 100k
environments costs nothing. A candidate from the bands is confirmed by the estimated
Jaccard similarity of the stored signatures before it counts as a near-duplicate.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from functools import lru_cache

import numpy as np

from spade_async.errors import ConfigError
from spade_async.memory.records import normalize

_TOKEN = re.compile(r"\w+|[^\w\s]")
_SEED = 1


@lru_cache(maxsize=8)
def _permutations(num_perm: int):
    from datasketch import MinHash  # lazy: datasketch imports scipy (~1 s)

    return MinHash(num_perm=num_perm, seed=_SEED).permutations


@lru_cache(maxsize=8)
def band_ranges(threshold: float, num_perm: int) -> tuple[tuple[int, int], ...]:
    """(start, end) of each LSH band, as datasketch picks them for ``threshold``."""
    try:
        from datasketch import MinHashLSH

        lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    except ValueError as exc:
        raise ConfigError(
            f"memory.near_dup_threshold={threshold} with memory.num_perm={num_perm}: {exc}; "
            "lower the threshold or raise num_perm"
        ) from None
    return tuple((int(a), int(b)) for a, b in lsh.hashranges)


def shingles(code: str, k: int) -> set[bytes]:
    tokens = _TOKEN.findall(normalize(code))
    if len(tokens) <= k:
        return {" ".join(tokens).encode()}
    return {" ".join(tokens[i : i + k]).encode() for i in range(len(tokens) - k + 1)}


def signature(code: str, *, num_perm: int, k: int) -> np.ndarray:
    """MinHash signature (uint32[num_perm]) of ``code``'s token shingles."""
    from datasketch import MinHash

    m = MinHash(
        num_perm=num_perm,
        permutations=_permutations(num_perm),
        scheme="affine32",
        hashfunc=zlib.crc32,
    )
    m.update_batch(list(shingles(code, k)))
    return np.asarray(m.hashvalues, dtype=np.uint32)


def band_keys(sig: np.ndarray, ranges: tuple[tuple[int, int], ...]) -> list[bytes]:
    """One 17-byte key per band: band index + 16-byte digest of that band's values."""
    return [
        bytes([i]) + hashlib.blake2b(sig[a:b].tobytes(), digest_size=16).digest()
        for i, (a, b) in enumerate(ranges)
    ]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Estimated Jaccard similarity of two signatures."""
    return float(np.count_nonzero(a == b)) / len(a)


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint32)
