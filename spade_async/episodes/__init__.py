"""Replayable episodes: what every agent episode of a run did, and a check that it still does.

``records.py``: one ``EpisodeRecord`` per episode played, appended to
``RUN_DIR/episodes/records.jsonl`` by the loop (environment id and code hash, seed, the
actions the environment received, per-turn policy versions, step rewards and flags, and
observation hashes). ``replay.py``: re-run a record in the sandbox pool and compare every
observation and reward. ``cli.py``: ``spade episode ls|replay``.
"""
