"""Per-request sampling seeds: one run's generation requests repeat when the run does.

Every generation request (designer, hint, agent, evaluation) carries
``sampling_params.sampling_seed`` = ``request_seed(run seed, role, identity...)``: a hash of
the run's seed and what the request *is* (role, step or policy version, environment id,
slot, turn, attempt), never of when it happened to be sent. Two runs of one seed therefore
send the same seed for the same request whatever order the requests arrive in.

The field is SGLang's own (``sglang/srt/sampling/sampling_params.py``, ``sampling_seed:
Optional[int]``, accepted in ``[-2**63, 2**63 - 1]``; the contract tests read the pinned
wheel's field list). SGLang samples with it only under ``--enable-deterministic-inference``
(``sampling_batch_info.py``: without it the per-request seed tensor is None), and then from
(seed, position) alone: the ``n`` copies of one request would share a seed and sample the
same tokens, so the client sends a seeded ``n > 1`` request as ``n`` prompts with seeds
``seed + i`` (``GenerationClient.generate_n``), as the CPU engine expands ``n`` itself
(``server.py``). Seeds stay below ``2**62`` so ``seed + i`` fits both engines.
"""

from __future__ import annotations

import hashlib

__all__ = ["SEED_BITS", "request_seed"]

SEED_BITS = 62  # room for seed + i (n samples) under SGLang's int64 and torch's manual_seed


def request_seed(*identity: object) -> int:
    """A seed in ``[0, 2**62)`` from ``identity`` (ints, strings, None, bools; order matters).

    ``request_seed(7, "agent", 3, "ab12", 5, 0)`` is the same in every process and run;
    a change in any part gives an unrelated seed. Parts are joined unambiguously
    (``repr`` of each, unit-separated), so ``("a", "bc")`` and ``("ab", "c")`` differ."""
    text = "\x1f".join(repr(part) for part in identity)
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << SEED_BITS) - 1)
