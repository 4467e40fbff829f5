"""Generation: one HTTP client for SGLang and the CPU engine, token in and token out.

- ``client``: ``GenerationClient`` (retries, timeouts, routing, weight updates).
- ``server`` + ``engine``: the CPU engine speaking SGLang's native API subset.
- ``sglang``: launcher for ``sglang.launch_server`` processes.
- ``chat``: chat templating and append-only multi-turn token lists.
- ``protocol``: msgspec wire structs; ``logprob_convention``: the log-prob definition.
"""
