"""The node in virtual time: the project's own loop on simulated engines, trainer and
environments (``bench/simulate.py``, ``spade plan RECIPE --throughput``).

- ``clock``: an asyncio loop whose clock jumps to the next timer when nothing is ready;
- ``costs``: the cost model, every input with its source; ``calibrate``: costs measured on
  this machine (``bench/pipeline.py``'s saved stage timings);
- ``engine``: ``SimClient`` (the generation client over simulated SGLang engines);
  ``parts``: tokenizer, environment pool and trainer;
- ``runtime``: a ``Runtime`` of simulated parts, run through ``loop.run``'s own schedule;
- ``throughput``: the placement x ``max_staleness`` table.

Nothing here re-implements the loop: admission, batching, staleness and versions, designer
windows, pushes and retries are ``spade_async/loop``'s own code.
"""
