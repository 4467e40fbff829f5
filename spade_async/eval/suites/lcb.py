"""LiveCodeBench code generation, graded by LiveCodeBench's own ``testing_util.run_test``.

Data: the user's copy of ``livecodebench/code_generation_lite`` (``test.jsonl`` ..
``test6.jsonl``; not shipped: ``--data livecodebench=DIR`` or one ``.jsonl`` file).
Selection, as LiveCodeBench's ``--release_version``/``--start_date``/``--end_date``:

- ``livecodebench.release``: ``release_vN`` (cumulative: test.jsonl .. testN.jsonl, the
  default ``release_v6`` = 1,055 problems), ``release_latest`` (= release_v6), ``vN`` (one
  file: ``v6`` = test6.jsonl, 175 problems), ``vN_vM`` (files N..M); ``DIR#release_v6``
  also works.
- ``livecodebench.start_date`` / ``livecodebench.end_date``: ``YYYY-MM-DD``, inclusive, on
  ``contest_date`` (LiveCodeBench's ``filter_dataset_by_date``).

Which set the paper used: the reference (``eval_offline/suites/livecodebench.py``) passes
``--release_version release_v6`` to the grader, but its loader ignores the release, and
``scripts/setup_lcb.sh`` fetches only ``test6.jsonl``; its in-loop config plays 175
episodes, i.e. test6.jsonl = ``v6`` here. For the paper's column use ``release=v6``.

Prompt and extraction (``livecodebench.prompt``): ``lcb`` (default) is LiveCodeBench's own
``format_prompt_generation`` for chat models (``LMStyle.OpenAIChat``: its system message and
its question template) and its ``extract_code`` (the text between the last two ```` ``` ````
lines); ``reference`` is the reference SPADE's own user prompt and extraction (the last
```` ```python ```` block, else the whole text). Reference defaults: n 1, temperature 0.2,
top_p 0.95, 16,384 tokens.

Grading: every sample is an episode of ``lcb_env.SOURCE`` on a fresh worker of the package
pool (``nvidia-livecodebench`` and numpy bound read-only), one step per test, stopping at
the first failure as ``run_test`` does; timeout 6 s per test (LiveCodeBench's default).

Against the lcb_runner commit the reference pins (28fef95, ``scripts/setup_lcb.sh``; that
commit is not in our index, the stored upstream ``lcb_runner/evaluation/testing_util.py``
at 15808c76 was compared): ``nvidia-livecodebench`` 26.3's ``testing_util.py`` has the same
``import_string`` (with ``sys.setrecursionlimit(50000)``), ``clean_if_name``,
``make_function``, ``call_method`` (``SystemExit`` passed over), ``compile_code``,
``grade_call_based`` (tuple -> list), ``grade_stdio`` (stripped lines, then ``Decimal``
tokens), ``run_test(timeout=6)`` and ``reliability_guard``; its
``compute_code_generation_metrics`` the same ``set_int_max_str_digits(50000)`` and global
timeout. What differs here, by construction: the global bound is the pool's per-call
timeout (10 s) per test instead of ``(6 + 1) * tests + 5`` s for the whole run (only a
program that catches LiveCodeBench's alarm exception and keeps running can tell); the
worker's address space is capped (the package pool's 2,048 MB; LiveCodeBench sets none);
and the sandbox has no network, no writable files outside its tmpfs and no process
creation (LiveCodeBench disables ``os.fork``/``subprocess.Popen`` itself as well).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import io
import json
import pickle
import re
import sys
import types
import zlib
from datetime import date
from pathlib import Path

from spade_async.envs.process import EnvError
from spade_async.errors import SpadeError
from spade_async.eval.metrics import suite_metrics
from spade_async.eval.suites.base import Context, Suite, fresh_instance
from spade_async.eval.suites.lcb_env import SOURCE
from spade_async.eval.types import Item, Sample, Sampling

__all__ = ["LiveCodeBench", "grade", "lcb_prompt", "select_files"]

PACKAGE = "nvidia-livecodebench"
PIN = "26.3"
TIMEOUT_S = 6  # LiveCodeBench's codegen_metrics(timeout=6), custom_evaluator's default
LCB_FORMAT = (
    "LiveCodeBench code_generation_lite files (test.jsonl .. test6.jsonl from the Hugging Face "
    "dataset livecodebench/code_generation_lite): --data livecodebench=DIR (or one .jsonl file)"
)
FIELDS = ("question_id", "question_content", "public_test_cases", "private_test_cases")
REFERENCE_INSTRUCTION = "\nWrite the complete solution in a single ```python ... ``` block."
_REFERENCE_FENCE = re.compile(r"```python\s*\n(.*?)\n```", re.S)


def _missing() -> SpadeError:
    return SpadeError(
        f"suite livecodebench grades with LiveCodeBench's own grader: pip install --no-deps "
        f"{PACKAGE}=={PIN} (make install does)"
    )


@functools.lru_cache(maxsize=1)
def _lcb_modules():
    """LiveCodeBench's prompt and extraction code. ``livecodebench.prompts/__init__`` imports
    every scenario's prompts (one needs ``anthropic``), so ``prompts/code_generation.py`` is
    loaded on its own; it imports ``datasets`` (through ``livecodebench.benchmarks``, for
    loading from the hub, which we never do): when that is not installed, a stand-in that
    refuses to load takes its place for the import only."""
    spec = importlib.util.find_spec("livecodebench")
    if spec is None or not spec.submodule_search_locations:
        raise _missing()
    stub = None
    if "datasets" not in sys.modules and importlib.util.find_spec("datasets") is None:
        stub = types.ModuleType("datasets")

        def refuse(*_a, **_k):
            raise SpadeError("livecodebench data comes from --data, never the hub")

        stub.load_dataset, stub.Dataset = refuse, object
        sys.modules["datasets"] = stub
    try:
        from livecodebench.lm_styles import LMStyle
        from livecodebench.utils.extraction_utils import extract_code

        path = Path(list(spec.submodule_search_locations)[0]) / "prompts" / "code_generation.py"
        file_spec = importlib.util.spec_from_file_location("lcb_prompts_code_generation", path)
        code_generation = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(code_generation)
    finally:
        if stub is not None and sys.modules.get("datasets") is stub:
            del sys.modules["datasets"]
    return LMStyle, code_generation, extract_code


def lcb_prompt(question: str, starter: str, style: str = "lcb") -> list[dict]:
    if style == "reference":
        parts = [question]
        if starter:
            parts.append("\nStarter code:\n```python\n" + starter + "\n```")
        parts.append(REFERENCE_INSTRUCTION)
        return [{"role": "user", "content": "\n".join(parts)}]
    LMStyle, code_generation, _ = _lcb_modules()
    problem = types.SimpleNamespace(question_content=question, starter_code=starter)
    return code_generation.format_prompt_generation(problem, LMStyle.OpenAIChat)


def extract(completion: str, style: str = "lcb") -> str:
    if style == "reference":
        found = _REFERENCE_FENCE.findall(completion or "")
        return found[-1] if found else completion
    LMStyle, _, extract_code = _lcb_modules()
    return extract_code(completion or "", LMStyle.OpenAIChat)


def select_files(release: str) -> list[str]:
    """File names of a LiveCodeBench release tag, as its dataset script maps them."""
    name = lambda i: "test.jsonl" if i == 1 else f"test{i}.jsonl"  # noqa: E731
    if release == "release_latest":
        release = "release_v6"
    if m := re.fullmatch(r"release_v([1-6])", release):
        return [name(i) for i in range(1, int(m.group(1)) + 1)]
    if m := re.fullmatch(r"v([1-6])", release):
        return [name(int(m.group(1)))]
    if (m := re.fullmatch(r"v([1-6])_v([1-6])", release)) and m.group(1) < m.group(2):
        return [name(i) for i in range(int(m.group(1)), int(m.group(2)) + 1)]
    raise SpadeError(
        f"livecodebench release '{release}': use release_v1 .. release_v6, release_latest, "
        "v1 .. v6 (one file) or vN_vM"
    )


def _date(value: str, what: str) -> date:
    try:
        return date.fromisoformat(value[:10])
    except ValueError:
        raise SpadeError(f"livecodebench.{what} '{value}': use YYYY-MM-DD") from None


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # private tests are a pickled str only
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _private_tests(blob: str) -> list[dict]:
    try:
        return json.loads(blob)
    except json.JSONDecodeError:  # LiveCodeBench's base64(zlib(pickle(json str)))
        raw = zlib.decompress(base64.b64decode(blob.encode()))
        return json.loads(_NoGlobals(io.BytesIO(raw)).load())


async def grade(ctx: Context, code: str, tests: list[dict], fn_name: str | None,
                timeout: int = TIMEOUT_S) -> tuple[float, str]:  # fmt: skip
    """LiveCodeBench's verdict on ``code``: 1.0 when every test passes, else 0.0 and why."""
    if ctx.package_pool is None:
        raise SpadeError("livecodebench grading needs Context.package_pool (runner.evaluate)")
    kwargs = {"code": code, "fn_name": fn_name, "timeout": timeout}
    pool = ctx.package_pool
    try:
        async with fresh_instance(pool, SOURCE, "lcb", kwargs) as inst:
            await pool.step(inst, json.dumps({"compile": True}))
            for t in tests:
                obs, reward, *_ = await pool.step(
                    inst, json.dumps({"input": t["input"], "output": t["output"]})
                )
                if reward < 1.0:
                    return 0.0, obs
            return 1.0, "passed"
    except EnvError as exc:  # past the per-call timeout, crash, memory: LCB's global timeout
        return 0.0, f"sandbox: {exc}"


class LiveCodeBench(Suite):
    name = "livecodebench"
    sampling = Sampling(n=1, temperature=0.2, top_p=0.95, max_tokens=16384)
    majority = False
    needs_pool = True
    packages = (PACKAGE, "numpy")  # testing_util imports numpy

    def __init__(self, path: str | None) -> None:
        self.path, _, release = (path or "").partition("#")
        self.release = release or "release_v6"
        self.start: date | None = None
        self.end: date | None = None
        self.style = "lcb"
        self.notes: list[str] = []
        self.difficulty: dict[str, str] = {}

    def configure(self, options: dict[str, str]) -> None:
        for key, value in options.items():
            if key == "release":
                select_files(value)
                self.release = value
            elif key == "start_date":
                self.start = _date(value, key)
            elif key == "end_date":
                self.end = _date(value, key)
            elif key == "prompt":
                if value not in ("lcb", "reference"):
                    raise SpadeError(f"livecodebench.prompt '{value}': use lcb or reference")
                self.style = value
            else:
                raise SpadeError(
                    f"livecodebench takes options release, start_date, end_date, prompt; got '{key}'"
                )

    def _files(self) -> list[Path]:
        p = Path(self.path)
        if not self.path or not p.exists():
            raise SpadeError(f"suite livecodebench has no data: expected {LCB_FORMAT}")
        if p.is_file():
            return [p]
        names = select_files(self.release)
        missing = [n for n in names if not (p / n).is_file()]
        if missing:
            hint = (
                "; with test6.jsonl alone use --data livecodebench.release=v6 (the reference's set)"
                if (p / "test6.jsonl").is_file() and self.release != "v6"
                else ""
            )
            raise SpadeError(
                f"livecodebench {self.release} needs {', '.join(missing)} in {p}: expected "
                f"{LCB_FORMAT}{hint}"
            )
        return [p / n for n in names]

    def load(self, limit: int) -> list[Item]:
        items = []
        for f in self._files():
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    item = self._item(f, n, line)
                    if item is not None:
                        items.append(item)
        self.difficulty = {i.id: str(i.meta.get("difficulty") or "") for i in items}
        window = (
            f" from {self.start or '...'} to {self.end or '...'}" if self.start or self.end else ""
        )
        self.notes = [
            f"LiveCodeBench {self.release}{window}: {len(items)} problems; prompt {self.style}"
        ]
        return items[:limit] if limit else items

    def _item(self, f: Path, n: int, line: str) -> Item | None:
        where = f"{f}:{n}"
        try:
            row = json.loads(line)
        except ValueError:
            raise SpadeError(f"{where}: not a JSON line; expected {LCB_FORMAT}") from None
        if not isinstance(row, dict):
            raise SpadeError(f"{where}: not a JSON object; expected {LCB_FORMAT}")
        for key in FIELDS:
            if not isinstance(row.get(key), str | int) or row.get(key) == "":
                raise SpadeError(f"{where}: field '{key}' missing or empty; expected {LCB_FORMAT}")
        when = row.get("contest_date")
        if self.start or self.end:
            if not isinstance(when, str):
                raise SpadeError(
                    f"{where}: field 'contest_date' missing (needed by the date window)"
                )
            day = _date(when, f"contest_date at {where}")
            if (self.start and day < self.start) or (self.end and day > self.end):
                return None
        field = "public_test_cases"
        try:
            tests = json.loads(row[field])
            field = "private_test_cases"
            tests = tests + _private_tests(row[field])
            field = "metadata"
            meta = json.loads(row.get("metadata") or "{}")
            for t in tests:
                field = "public_test_cases/private_test_cases entry"
                if not (isinstance(t, dict) and isinstance(t["input"], str)
                        and isinstance(t["output"], str)):  # fmt: skip
                    raise TypeError("input/output must be strings")
        except (ValueError, KeyError, TypeError, zlib.error, pickle.UnpicklingError) as exc:
            raise SpadeError(
                f"{where}: field '{field}' malformed ({exc}); expected {LCB_FORMAT}"
            ) from None
        starter = row.get("starter_code") or ""
        return Item(
            id=str(row["question_id"]),
            messages=lcb_prompt(row["question_content"], starter, self.style),
            answer="",
            meta={"tests": tests, "func_name": (meta or {}).get("func_name"),
                  "difficulty": row.get("difficulty"), "contest_date": when},
        )  # fmt: skip

    def metrics(self, samples: list[Sample], k: int) -> dict[str, float]:
        """avg@k, pass@k; then pass@1 per difficulty (``pass@1_easy`` ...), as LiveCodeBench's
        ``compute_scores`` and the reference report them."""
        out = suite_metrics(samples, k=k, majority=False)
        for level in ("easy", "medium", "hard"):
            part = [s for s in samples if self.difficulty.get(s.id) == level]
            if part:
                out[f"pass@1_{level}"] = suite_metrics(part, k=1, majority=False)["pass@1"]
        return out

    async def score(self, item: Item, completion: str, ctx: Context) -> tuple[str | None, float]:
        code = extract(completion, self.style)
        if not code.strip():
            return None, 0.0
        score, _ = await grade(ctx, code, item.meta["tests"], item.meta.get("func_name"))
        return code, score
