"""Held-out evaluation: suites (loader, prompt, extractor, scorer), metrics, ``spade eval``.

    suites/    one module per family: math (AIME), code (HumanEval), lcb (LiveCodeBench,
               graded by its own testing_util in the sandbox), rg (reasoning-gym), bfcl
               (BFCL-v4 on bfcl-eval's checkers), files (GPQA), acebench
               (ACEBench-Agent, from the user's checkout, with a user simulator)
    runner     plays every (item, sample) concurrently through a ``Generator``
    checker    spawn worker processes for trusted library checkers (math-verify,
               reasoning-gym) with a wall-clock timeout per call
    metrics    avg@k, unbiased pass@k, maj@k; table columns, the paper's composite,
               bootstrap intervals clustered by problem (RG: by task)
    cli        ``spade eval``; inloop: evaluation inside a training run

Model-written code and tool calls only ever run in the project's sandbox pool
(``spade_async.envs.pool``), never in the evaluating process.
"""
