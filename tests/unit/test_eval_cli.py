"""``spade eval``: bad input is one line and exit 2; --responses re-scores; --compare."""

import json
import sys
from pathlib import Path

import anyio
import pytest

from spade_async.cli import main
from spade_async.eval.runner import evaluate

sys.path.insert(0, str(Path(__file__).parent))
from eval_scripted import Scripted  # noqa: E402


def _gpqa(tmp_path: Path, n: int = 12) -> Path:
    rows = [{"Question": f"Q{i}?", "Correct Answer": f"right{i}", "Incorrect Answer 1": "w1",
             "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"} for i in range(n)]  # fmt: skip
    path = tmp_path / "gpqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(tmp_path, name, reply, data):
    out = tmp_path / name
    out.mkdir()

    async def go():
        return await evaluate(["gpqa_diamond"], Scripted(reply), out=out, model=name, n=2,
                              data={"gpqa_diamond": str(data)})  # fmt: skip

    return out, anyio.run(go)


def _letter(item, messages):
    return f"\\boxed{{{item.answer}}}"


def _half(item, messages):  # right on even questions only
    return _letter(item, messages) if int(item.id.split("-")[1]) % 2 == 0 else "\\boxed{Z}"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["eval", "m", "--suites", "aime_25"], "did you mean 'aime25'"),
        (["eval", "m", "--suites", ""], "--suites is empty"),
        (["eval", "m", "--suites", "gpqa_diamond", "--data", "gpqa_diamond=/nope.csv"], "expected the GPQA-Diamond file"),
        (["eval", "--compare", "/nope/a.json", "/nope/b.json"], "no such results.json"),
        (["eval", "--responses", "/nope.jsonl", "--suites", "aime25"], "no such responses file"),
        (["eval", "--suites", "aime25"], "name a model or run directory"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_results_files_rescoring_and_compare(tmp_path, capsys):
    data = _gpqa(tmp_path)
    a_dir, a = _run(tmp_path, "a", _half, data)
    b_dir, b = _run(tmp_path, "b", _letter, data)
    assert a.suites["gpqa_diamond"].metrics["avg@2"] == 0.5
    assert b.suites["gpqa_diamond"].metrics == {
        "avg@2": 1.0,
        "pass@1": 1.0,
        "pass@2": 1.0,
        "maj@2": 1.0,
    }
    res = json.loads((a_dir / "results.json").read_text())
    assert res["complete"] and res["suites"]["gpqa_diamond"]["samples"] == 24
    # re-score A's completions: same scores, no generation
    assert main(["eval", "--responses", str(a_dir / "gpqa_diamond.jsonl"), "--suites", "gpqa_diamond",
                 "--data", f"gpqa_diamond={data}", "--out", str(tmp_path / "re"), "--json"]) == 0  # fmt: skip
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["suites"]["gpqa_diamond"]["metrics"]["avg@2"] == 0.5
    # compare: B - A = +0.5 on every paired problem set; the interval brackets it
    assert (
        main(
            [
                "eval",
                "--compare",
                str(a_dir / "results.json"),
                str(b_dir / "results.json"),
                "--json",
            ]
        )
        == 0
    )
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["columns"]["GPQA-Diamond"]
    assert row["value"] == 0.5 and row["ci95"][0] <= 0.5 <= row["ci95"][1] and row["clusters"] == 12


def test_a_failed_run_leaves_no_results_json(tmp_path):
    data = _gpqa(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")  # from an earlier run

    async def boom(messages, sampling, *, item=None):
        raise RuntimeError("engine died")

    async def go():
        await evaluate(["gpqa_diamond"], boom, out=out, model="m", data={"gpqa_diamond": str(data)})

    with pytest.raises(BaseException, match="engine died|unhandled errors"):
        anyio.run(go)
    assert not (out / "results.json").exists()


def test_malformed_responses_file_names_the_line(tmp_path, capsys):
    data = _gpqa(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "gpqa-1", "sample": 0, "prompt": "", "completion": "", "answer": "A", "extracted": null, "score": 0}\nnot json\n'
    )
    assert (
        main(
            [
                "eval",
                "--responses",
                str(bad),
                "--suites",
                "gpqa_diamond",
                "--data",
                f"gpqa_diamond={data}",
            ]
        )
        == 2
    )
    assert f"{bad}:2:" in capsys.readouterr().err


def test_responses_with_uneven_sample_counts_score_what_is_there_and_say_so(tmp_path, capsys):
    """Problem 0 has two samples (one right), problems 1 and 2 one each (right, wrong): no
    'pass@2 needs 2 samples' crash; k is the fewest (1), and a note names the spread."""
    data = _gpqa(tmp_path, 3)
    a_dir, _ = _run(tmp_path, "a", _letter, data)
    lines = [json.loads(x) for x in (a_dir / "gpqa_diamond.jsonl").read_text().splitlines()]
    keep = [x for x in lines if x["id"] == "gpqa-1"]
    keep[1]["completion"] = "\\boxed{Z}"
    keep += [next(x for x in lines if x["id"] == "gpqa-2")]
    last = [x for x in lines if x["id"] == "gpqa-3"][0]
    last["completion"] = "\\boxed{Z}"
    keep.append(last)
    uneven = tmp_path / "uneven.jsonl"
    uneven.write_text("".join(json.dumps(x) + "\n" for x in keep))
    out = tmp_path / "re"
    assert main(["eval", "--responses", str(uneven), "--suites", "gpqa_diamond",
                 "--data", f"gpqa_diamond={data}", "--out", str(out), "--json"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    res = json.loads(captured.out.strip().splitlines()[-1])["suites"]["gpqa_diamond"]
    assert res["k"] == 1 and res["samples"] == 4 and res["n_problems"] == 3
    assert res["metrics"]["avg@1"] == 0.5  # 2 of the 4 samples
    assert res["metrics"]["pass@1"] == pytest.approx((0.5 + 1.0 + 0.0) / 3, abs=1e-12)
    note = "uneven sample counts in uneven.jsonl: 2 problems with 1, 1 problem with 2"
    assert any(n.startswith(note) for n in res["notes"])
    assert note in " ".join((captured.out + captured.err).split())
    assert json.loads((out / "results.json").read_text())["suites"]["gpqa_diamond"]["k"] == 1


def test_a_responses_file_of_another_suite_is_one_line_naming_file_line_and_field(tmp_path, capsys):
    data = _gpqa(tmp_path, 3)
    a_dir, _ = _run(tmp_path, "a", _letter, data)
    other = tmp_path / "aime25.jsonl"
    other.write_text(
        '{"id": "aime25-0", "sample": 0, "prompt": "p", "completion": "", "answer": "7", "extracted": null, "score": 0}\n'
    )
    argv = [
        "eval",
        "--responses",
        str(other),
        "--suites",
        "gpqa_diamond",
        "--data",
        f"gpqa_diamond={data}",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"{other}:1: field 'id'" in err and "\n" not in err
    # same ids, other problems (another data file): the prompt field is compared
    lines = (a_dir / "gpqa_diamond.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["prompt"] = "What is the capital of France?"
    changed = tmp_path / "changed.jsonl"
    changed.write_text(lines[0] + "\n" + json.dumps(row) + "\n")
    argv[2] = str(changed)
    assert main(argv + ["--out", str(a_dir)]) == 2
    assert f"{changed}:2: field 'prompt'" in capsys.readouterr().err
    assert (a_dir / "results.json").is_file()  # nothing already scored is lost
    assert (a_dir / "gpqa_diamond.jsonl").read_text().splitlines() == lines


def test_an_unknown_suite_in_responses_is_exit_2(tmp_path, capsys):
    f = tmp_path / "x.jsonl"
    f.write_text("")
    assert main(["eval", "--responses", str(f), "--suites", "gpqa_diamnod"]) == 2
    assert "did you mean 'gpqa_diamond'" in capsys.readouterr().err
