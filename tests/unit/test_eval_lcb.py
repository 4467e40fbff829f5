"""LiveCodeBench: our verdicts are LiveCodeBench's own (``testing_util.run_test`` of the
``nvidia-livecodebench`` package, run inside our sandbox), on hand-made programs whose right
verdict a careful reader can tell, and they equal what the same grader gives when run the
way lcb_runner runs it (``run_test`` over all tests at once, in a process of its own)."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import pickle
import subprocess
import sys
import zlib

import anyio
import msgspec
import pytest

from spade_async.envs.pool import EnvPool
from spade_async.errors import SpadeError
from spade_async.eval.runner import EVAL_POOL
from spade_async.eval.suites import Context, make_suite
from spade_async.eval.suites.lcb import PACKAGE, extract, lcb_prompt, select_files

STDIN_SUM = [("2 3\n", "5\n"), ("10 -4\n", "6\n")]
HALF = [("3\n", "1.5\n"), ("4\n", "2\n")]
WORDS = [("a b\n", "a b\n")]
LISTS = [("[3, 1, 2]", "[1, 2, 3]"), ("[5]", "[5]")]
FREQ = [('"abca"', '"a"'), ('"zzy"', '"z"')]
DEPTH = [("3000\n", "3000\n")]
F = "functional"

# (name, tests, fn_name, program, verdict a careful reader gives, which LiveCodeBench shares)
CASES = [
    ("sum", STDIN_SUM, None, "a, b = map(int, input().split())\nprint(a + b)", 1.0),
    ("wrong", STDIN_SUM, None, "a, b = map(int, input().split())\nprint(a - b)", 0.0),
    (
        "exit_after_print",
        STDIN_SUM,
        None,
        "a, b = map(int, input().split())\nprint(a + b)\nexit()",
        1.0,
    ),
    (
        "sys_exit_0",
        STDIN_SUM,
        None,
        "import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)",
        1.0,
    ),
    (
        "main_guard",
        STDIN_SUM,
        None,
        "def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\nif __name__ == '__main__':\n    main()",
        1.0,
    ),
    (
        "stdin_read",
        STDIN_SUM,
        None,
        "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)",
        1.0,
    ),
    (
        "stdin_readline",
        STDIN_SUM,
        None,
        "import sys\na, b = map(int, sys.stdin.readline().split())\nprint(a + b)",
        1.0,
    ),
    ("three_point_zero", [("1\n", "3\n")], None, "input()\nprint(3.0)", 1.0),
    ("float_for_int", HALF, None, "n = int(input())\nprint(n / 2)", 1.0),  # 2.0 for 2
    (
        "inner_spaces_numbers",
        STDIN_SUM,
        None,
        "a, b = map(int, input().split())\nprint(' ', a + b, ' ')",
        1.0,
    ),
    ("inner_spaces_words", WORDS, None, "print('a  b')", 0.0),  # tokens are not numbers: exact line
    ("float_noise", [("1\n", "0.3\n")], None, "input()\nprint(0.1 + 0.2)", 0.0),  # Decimal is exact
    ("case", [("1\n", "Yes\n")], None, "input()\nprint('yes')", 0.0),
    ("missing_line", [("1\n", "1\n2\n")], None, "input()\nprint(1)", 0.0),
    (
        "trailing_blank_lines",
        STDIN_SUM,
        None,
        "a, b = map(int, input().split())\nprint(a + b)\nprint()\nprint()",
        1.0,
    ),
    ("runtime_error", STDIN_SUM, None, "a, b = map(int, input().split())\nprint(a // 0)", 0.0),
    ("syntax_error", STDIN_SUM, None, "print(", 0.0),
    ("second_test_fails", STDIN_SUM, None, "a, b = map(int, input().split())\nprint(5)", 0.0),
    (
        "counter_without_import_stdin",
        [("abca\n", "a\n")],
        None,
        "s = input()\nprint(Counter(s).most_common(1)[0][0])",
        1.0,
    ),
    (
        "quit_is_disabled",
        STDIN_SUM,
        None,
        "a, b = map(int, input().split())\nprint(a + b)\nquit()",
        0.0,
    ),
    (
        "deep_recursion",
        DEPTH,
        None,
        "def d(n):\n    return 0 if n == 0 else 1 + d(n - 1)\nprint(d(int(input())))",
        1.0,
    ),
    (
        "tuple_for_list",
        LISTS,
        "sortIt",
        "class Solution:\n    def sortIt(self, xs):\n        return tuple(sorted(xs))",
        1.0,
    ),
    (
        "list_ok",
        LISTS,
        "sortIt",
        "class Solution:\n    def sortIt(self, xs):\n        return sorted(xs)",
        1.0,
    ),
    (
        "list_wrong",
        LISTS,
        "sortIt",
        "class Solution:\n    def sortIt(self, xs):\n        return xs",
        0.0,
    ),
    (
        "counter_without_import",
        FREQ,
        "top",
        "class Solution:\n    def top(self, s: str) -> str:\n        return Counter(s).most_common(1)[0][0]",
        1.0,
    ),
    (
        "typing_without_import",
        LISTS,
        "sortIt",
        "class Solution:\n    def sortIt(self, xs: List[int]) -> List[int]:\n        return sorted(xs)",
        1.0,
    ),
    (
        "float_return_for_int",
        [("4", "2")],
        "half",
        "class Solution:\n    def half(self, n):\n        return n / 2",
        1.0,
    ),
    (
        "missing_method",
        LISTS,
        "sortIt",
        "class Solution:\n    def other(self, xs):\n        return sorted(xs)",
        0.0,
    ),
    (
        "instance_state_kept",
        [("1", "1"), ("1", "2")],
        "tick",
        "class Solution:\n    def __init__(self):\n        self.n = 0\n    def tick(self, x):\n        self.n += x\n        return self.n",
        1.0,
    ),
]
SLOW_CASES = [  # LiveCodeBench's 6 s alarm per test: 4.5 s passes, 7 s and forever do not
    ("loop", STDIN_SUM, None, "while True:\n    pass", 0.0),
    (
        "four_and_a_half_seconds",
        [("1\n", "1\n")],
        None,
        "import time\ntime.sleep(4.5)\nprint(input())",
        1.0,
    ),
    ("seven_seconds", [("1\n", "1\n")], None, "import time\ntime.sleep(7)\nprint(input())", 0.0),
]

LCB_HARNESS = r"""
import importlib.util, json, multiprocessing, os, sys
spec = importlib.util.find_spec("livecodebench")
path = os.path.join(list(spec.submodule_search_locations)[0], "evaluation", "testing_util.py")
ls = importlib.util.spec_from_file_location("lcb_testing_util", path)
tu = importlib.util.module_from_spec(ls); ls.loader.exec_module(tu)

def child(sample, code, q):  # lcb_runner's _temp_run, in a process of its own
    sys.set_int_max_str_digits(50000)
    res, meta = tu.run_test(sample, test=code, timeout=6)
    q.put([bool(r > 0) for r in res])

import time
jobs = []
for sample, code, n in json.load(sys.stdin):  # all at once, each its own process
    q = multiprocessing.get_context("fork").Queue()
    p = multiprocessing.get_context("fork").Process(target=child, args=(sample, code, q))
    p.start()
    jobs.append((p, q, time.monotonic() + (6 + 1) * n + 5))  # check_correctness's global timeout
out = []
for p, q, deadline in jobs:
    try:
        res = q.get(timeout=max(0.0, deadline - time.monotonic()))
    except Exception:
        res = [False]
    p.join(1)
    if p.is_alive():
        p.kill()
    out.append(1.0 if res and all(res) else 0.0)
print(json.dumps(out))
"""


def lcb_runner_verdicts(cases) -> list[float]:
    """LiveCodeBench's grader as lcb_runner calls it: all tests in one ``run_test``."""
    payload = [
        ({"input_output": json.dumps({"inputs": [i for i, _ in tests], "outputs": [o for _, o in tests],
                                      "fn_name": fn})}, code, len(tests))
        for _, tests, fn, code, _ in cases
    ]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", LCB_HARNESS], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(qid, tests, fn, date="2025-03-01", difficulty="easy"):
    typ = F if fn else "stdin"
    cases = [{"input": i, "output": o, "testtype": typ} for i, o in tests]
    blob = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases[1:])))).decode()
    return {"question_id": qid, "question_content": f"Problem {qid}.", "contest_date": date,
            "difficulty": difficulty,
            "starter_code": "class Solution:\n    pass" if fn else "",
            "public_test_cases": json.dumps(cases[:1]), "private_test_cases": blob,
            "metadata": json.dumps({"func_name": fn} if fn else {})}  # fmt: skip


def package_pool():
    cfg = msgspec.structs.replace(EVAL_POOL, packages=(PACKAGE, "numpy"), max_workers=4,
                                  memory_mb=2048)  # fmt: skip
    return EnvPool(cfg)


def ours(tmp_path, cases) -> list[float]:
    (tmp_path / "test.jsonl").write_text(
        "".join(json.dumps(_row(name, tests, fn)) + "\n" for name, tests, fn, _, _ in cases)
    )
    suite = make_suite("livecodebench", {"livecodebench": str(tmp_path / "test.jsonl")})
    items = {it.id: it for it in suite.load(0)}
    out: dict[str, float] = {}

    async def main():
        async with package_pool() as pool:
            ctx = Context(None, None, None, None, package_pool=pool)

            async def one(name, code):
                out[name] = (
                    await suite.score(items[name], f"Here:\n```python\n{code}\n```\n", ctx)
                )[1]

            async with anyio.create_task_group() as tg:
                for name, _, _, code, _ in cases:
                    tg.start_soon(one, name, code)

    anyio.run(main)
    return [out[name] for name, *_ in cases]


def test_lcb_verdicts_are_livecodebench_s_own_and_a_careful_reader_s(tmp_path):
    assert len(CASES) >= 20
    got = ours(tmp_path, CASES)
    want = [c[4] for c in CASES]
    names = [c[0] for c in CASES]
    assert dict(zip(names, got, strict=True)) == dict(zip(names, want, strict=True))
    assert lcb_runner_verdicts(CASES) == want  # the same grader, run as lcb_runner runs it


@pytest.mark.slow  # waits out LiveCodeBench's 6 s alarm
def test_lcb_per_test_timeout_is_six_seconds(tmp_path):
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        theirs = ex.submit(lcb_runner_verdicts, SLOW_CASES)
        got = ours(tmp_path, SLOW_CASES)
        assert got == [c[4] for c in SLOW_CASES] == theirs.result()


def test_lcb_prompt_and_extraction_are_livecodebench_s():
    msgs = lcb_prompt("Add two numbers.", "")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"].startswith("You are an expert Python programmer.")
    assert msgs[1]["content"].startswith(
        "### Question:\nAdd two numbers.\n\n### Format: Read the inputs from stdin"
    )
    assert msgs[1]["content"].endswith("### Answer: (use the provided format with backticks)\n\n")
    with_starter = lcb_prompt("Q", "class Solution:\n    def f(self): pass")[1]["content"]
    assert "You will use the following starter code" in with_starter
    # LCB's extract_code: between the last two ``` lines, whatever the language tag
    text = "think\n```python\nprint(1)\n```\nagain:\n```python3\nprint(2)\n```"
    assert extract(text) == "print(2)"
    assert extract("no fence here") == ""
    ref = lcb_prompt("Q", "S", "reference")
    assert ref == [{"role": "user", "content": "Q\n\nStarter code:\n```python\nS\n```\n\nWrite the "
                    "complete solution in a single ```python ... ``` block."}]  # fmt: skip
    assert extract("```python\nx = 1\n```", "reference") == "x = 1"
    assert extract("x = 2", "reference") == "x = 2"


def test_lcb_release_and_date_window(tmp_path):
    assert select_files("release_v6") == ["test.jsonl"] + [f"test{i}.jsonl" for i in range(2, 7)]
    assert select_files("v6") == ["test6.jsonl"]
    assert select_files("v2_v3") == ["test2.jsonl", "test3.jsonl"]
    assert select_files("release_latest") == select_files("release_v6")
    with pytest.raises(SpadeError, match="release_v1 .. release_v6"):
        select_files("release_v9")
    for n, (name, date) in enumerate(
        [("old", "2024-01-05"), ("mid", "2025-02-01"), ("new", "2025-05-02")], 1
    ):
        f = tmp_path / ("test.jsonl" if n == 1 else f"test{n}.jsonl")
        f.write_text(json.dumps(_row(name, STDIN_SUM, None, date)) + "\n")
    data = {"livecodebench": str(tmp_path)}
    assert [
        i.id
        for i in make_suite("livecodebench", data | {"livecodebench.release": "release_v3"}).load(0)
    ] == ["old", "mid", "new"]
    assert [
        i.id for i in make_suite("livecodebench", data | {"livecodebench.release": "v2"}).load(0)
    ] == ["mid"]
    window = data | {"livecodebench.release": "release_v3", "livecodebench.start_date": "2025-01-01",
                     "livecodebench.end_date": "2025-02-01"}  # fmt: skip
    assert [i.id for i in make_suite("livecodebench", window).load(0)] == ["mid"]
    with pytest.raises(SpadeError, match="test4.jsonl"):
        make_suite("livecodebench", {"livecodebench": f"{tmp_path}#release_v4"}).load(0)
    with pytest.raises(SpadeError, match="YYYY-MM-DD"):
        make_suite("livecodebench", data | {"livecodebench.start_date": "March"})


@pytest.mark.parametrize(
    ("field", "value"),
    [("question_id", None), ("public_test_cases", "not json"), ("private_test_cases", "%%%"),
     ("question_content", "")],
)  # fmt: skip
def test_lcb_bad_row_is_one_line_naming_file_line_and_field(tmp_path, field, value):
    good = _row("ok", STDIN_SUM, None)
    bad = dict(good)
    if value is None:
        del bad[field]
    else:
        bad[field] = value
    f = tmp_path / "test.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SpadeError) as err:
        make_suite("livecodebench", {"livecodebench": str(f)}).load(0)
    msg = str(err.value)
    assert "\n" not in msg and f"{f}:2" in msg and field in msg


def test_lcb_metrics_per_difficulty(tmp_path):
    from spade_async.eval.types import Sample

    f = tmp_path / "test.jsonl"
    f.write_text("".join(json.dumps(_row(q, STDIN_SUM, None, difficulty=d)) + "\n"
                         for q, d in [("e1", "easy"), ("e2", "easy"), ("h1", "hard")]))  # fmt: skip
    suite = make_suite("livecodebench", {"livecodebench": str(f)})
    suite.load(0)
    samples = [Sample(id=i, sample=0, prompt="", completion="", answer="", extracted=None, score=s)
               for i, s in [("e1", 1.0), ("e2", 0.0), ("h1", 1.0)]]  # fmt: skip
    m = suite.metrics(samples, 1)
    assert list(m)[0] == "avg@1" and m["pass@1"] == pytest.approx(2 / 3, abs=1e-12)
    assert m["pass@1_easy"] == 0.5 and m["pass@1_hard"] == 1.0 and "pass@1_medium" not in m


def test_lcb_with_test6_alone_points_at_the_reference_s_release(tmp_path):
    (tmp_path / "test6.jsonl").write_text(json.dumps(_row("q", STDIN_SUM, None)) + "\n")
    with pytest.raises(SpadeError, match="livecodebench.release=v6"):
        make_suite("livecodebench", {"livecodebench": str(tmp_path)}).load(0)
    suite = make_suite(
        "livecodebench", {"livecodebench": str(tmp_path), "livecodebench.release": "v6"}
    )
    assert [i.id for i in suite.load(0)] == ["q"]
