"""Environment source that grades one LiveCodeBench program with LiveCodeBench's own grader.

Our own code, not model-written: it loads ``livecodebench/evaluation/testing_util.py`` from
the PyPI package ``nvidia-livecodebench`` (bound read-only into the worker through
``PoolConfig.packages``; the file is loaded on its own, the package's ``__init__`` pulls in
``datasets`` and ``tqdm``) and calls its ``run_test`` inside the sandbox: the pre-imported
standard set, ``sys.setrecursionlimit(50000)``, ``SystemExit`` ignored, whitespace-split
lines compared as ``Decimal`` where they parse, tuples read as lists, a 6 s ``SIGALRM`` per
test and ``reliability_guard`` are all LiveCodeBench's, not ours.

One ``step`` = one test, so the pool's per-call timeout bounds each test (LiveCodeBench's
own run bounds all tests together by ``(timeout + 1) * tests + 5`` s). To keep the state a
single LiveCodeBench run has across its tests (one compiled module, one ``Solution()``
instance), the module's ``compile_code`` is memoised per code string: every test after the
first reuses the object the first compile made, exactly as ``grade_call_based`` and
``grade_stdio`` reuse theirs inside one run; and ``reliability_guard`` runs once, before
the compile, as in one ``run_test`` (a second call raises: it has disabled ``os.putenv``). The action ``{"compile": true}`` compiles
first (its own call, so module-level work does not eat into the first test's budget);
``{"input", "output"}`` runs one test. reward 1.0 = LiveCodeBench's verdict "all > 0".
"""

SOURCE = r"""
import importlib.util
import json
import os
import sys


def _testing_util():
    spec = importlib.util.find_spec("livecodebench")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("livecodebench (PyPI nvidia-livecodebench) is not importable here")
    path = os.path.join(list(spec.submodule_search_locations)[0], "evaluation", "testing_util.py")
    loader_spec = importlib.util.spec_from_file_location("lcb_testing_util", path)
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    return module


class LiveCodeBenchGradeEnv:
    def __init__(self, code, fn_name=None, timeout=6, max_turns=100000, **kwargs):
        # compute_code_generation_metrics sets this at import, in the process that grades
        sys.set_int_max_str_digits(50000)
        self.tu = _testing_util()
        self.code, self.fn_name, self.timeout = code, fn_name, int(timeout)
        self.max_turns = max_turns
        compiled = {}
        original = self.tu.compile_code

        def compile_once(code, timeout):
            if code not in compiled:
                compiled[code] = original(code, timeout)
            return compiled[code]

        self.tu.compile_code = compile_once
        guard, guarded = self.tu.reliability_guard, []

        def guard_once(*args, **kwargs):  # LCB guards once per process; twice raises
            if not guarded:
                guarded.append(guard(*args, **kwargs))

        self.tu.reliability_guard = guard_once

    def reset(self, seed=None):
        return "send {'compile': true}, then one {'input', 'output'} per test", {}

    def _sample(self, inputs, outputs):
        return {"input_output": json.dumps(
            {"inputs": inputs, "outputs": outputs, "fn_name": self.fn_name})}

    def _prepared(self):
        tu = self.tu
        if self.fn_name is not None:  # grade_call_based's preparation
            return tu.import_string + "\n\n" + self.code
        return tu.make_function(tu.clean_if_name(self.code))  # grade_stdio's

    def _with_stderr(self, fn):
        # faulthandler.enable() (called per test) needs a real file; the worker's sink is not
        saved = sys.stderr
        sys.stderr = sys.__stderr__ if sys.__stderr__ is not None else open(os.devnull, "w")
        try:
            return fn()
        finally:
            sys.stderr = saved

    def step(self, action):
        spec = json.loads(action)
        if spec.get("compile"):
            import signal

            signal.signal(signal.SIGALRM, self.tu.timeout_handler)
            self.tu.reliability_guard()  # run_test guards before it compiles
            try:
                self._with_stderr(lambda: self.tu.compile_code(self._prepared(), self.timeout))
            except BaseException as e:  # the test step compiles again and fails as LCB does
                return f"compile failed: {type(e).__name__}", 0.0, False, False, {}
            return "compiled", 1.0, False, False, {}
        sample = self._sample([spec["input"]], [spec["output"]])
        try:
            out = self._with_stderr(
                lambda: self.tu.run_test(sample, test=self.code, timeout=self.timeout))
        except BaseException as e:
            return f"grader raised {type(e).__name__}: {str(e)[:300]}", 0.0, True, False, {}
        if not out:
            return "grader returned nothing", 0.0, True, False, {}
        results, meta = out
        ok = bool(results) and all(bool(r > 0) for r in results)
        return json.dumps({"results": [repr(r) for r in results], "meta": meta},
                          default=repr)[:2000], 1.0 if ok else 0.0, not ok, False, {}

    def solution(self):
        return ""
"""
