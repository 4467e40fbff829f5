"""docs/throughput.md (and throughput-validation.md) and the saved bench results agree: every figure the page cites is
followed by ``<!-- FILE.json:PATH -->`` naming the saved value it shows, and every ratio
written ``N.NNx`` cites one. The value, rounded to the decimals shown (a ``%`` figure: the
value x 100), must equal the figure. A fenced block opened with ```` ```text FILE.json:PATH ````
must be the saved text at PATH, line for line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "docs" / n
    for n in (
        "throughput.md",
        "throughput-validation.md",
        "heldout-interleaved.md",
        "controller-cpu.md",
    )
]
REF = re.compile(r"(True|False|[+-]?[\d,]*\.?\d+)(x|%| s)?\s*<!-- ([\w.]+\.json):(\S+) -->")
BLOCK = re.compile(r"```text ([\w.]+\.json):(\S+)\n(.*?)```", re.DOTALL)
RATIO = re.compile(r"(?<![\w.])\d+\.\d+x(?!\s*<!--)")
sys.path.insert(0, str(ROOT / "bench"))
from doc_figures import resolve  # noqa: E402  (the one reader of a cited path, bench's own)


def cited(text: str) -> list[tuple[str, str, str, str]]:
    return REF.findall(text)


def check(text: str, results: Path) -> list[str]:
    """The disagreements: one line each (empty: the page and the results agree)."""
    bad = []
    for name, path, body in BLOCK.findall(text):
        saved = resolve(json.loads((results / name).read_text()), path)
        if body.rstrip("\n") != str(saved).rstrip("\n"):
            bad.append(f"the block citing {name}:{path} is not the saved text")
    text = BLOCK.sub("", text)
    bad += [f"{m.group(0)}: a ratio with no saved result cited" for m in RATIO.finditer(text)]
    for figure, unit, name, path in cited(text):
        value = resolve(json.loads((results / name).read_text()), path)
        if figure in ("True", "False"):  # a target's met: the saved boolean
            if not isinstance(value, bool) or str(value) != figure:
                bad.append(f"{figure} cites {name}:{path} = {value!r}")
            continue
        shown = float(figure.replace(",", ""))
        if unit == "%":
            value = value * 100
        decimals = len(figure.split(".")[1]) if "." in figure else 0
        if round(float(value), decimals) != shown:
            bad.append(f"{figure}{unit or ''} cites {name}:{path} = {value}")
    return bad


def test_the_page_and_the_saved_results_agree():
    for doc in DOCS:
        text = doc.read_text()
        assert len(cited(text)) >= 10, f"{doc.name} cites its figures"
        assert check(text, ROOT / "bench" / "results") == [], doc.name


def test_a_figure_that_disagrees_is_found(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"a": {"rows": [{"k": "x", "v": 2.061}]}}))
    ok = "2.06x <!-- r.json:a.rows[k=x].v -->"
    assert check(ok, tmp_path) == []
    assert check("2.10x <!-- r.json:a.rows[k=x].v -->", tmp_path)
    assert check("206.1% <!-- r.json:a.rows[k=x].v -->", tmp_path) == []
    assert check("a bare 2.06x here", tmp_path)
    (tmp_path / "m.json").write_text(json.dumps({"t": {"met": False, "v": 0.0}}))
    assert check("False <!-- m.json:t.met -->", tmp_path) == []
    assert check("True <!-- m.json:t.met -->", tmp_path)
    assert check("False <!-- m.json:t.v -->", tmp_path)  # a number is not a boolean
    block = "```text r.json:t\nA 1.50x\n```"
    (tmp_path / "r.json").write_text(json.dumps({"t": "A 1.50x", "a": {}}))
    assert check(block, tmp_path) == []
    assert check(block.replace("1.50x", "1.60x"), tmp_path)
    with pytest.raises(KeyError):
        check("1.0x <!-- r.json:a.nope -->", tmp_path)


def test_doc_figures_rewrites_the_cited_figures_and_nothing_else(tmp_path):
    """bench/doc_figures.py: a rerun's values in place of the old figures (their decimals,
    sign, commas and unit kept), cited blocks replaced whole, the prose untouched."""
    from doc_figures import refresh

    (tmp_path / "r.json").write_text(json.dumps(
        {"a": {"rows": [{"k": "x", "v": 2.0614, "e": -0.1104, "n": 12345.6}]}, "t": "A 1.50x\n"}))  # fmt: skip
    page = ("Async runs 1.90x <!-- r.json:a.rows[k=x].v --> faster (error +3.1% "
            "<!-- r.json:a.rows[k=x].e -->, 1,000 <!-- r.json:a.rows[k=x].n --> a step).\n"
            "```text r.json:t\nA 1.20x\n```\nThe 1.90x above is prose.\n")  # fmt: skip
    new, changed = refresh(page, tmp_path)
    assert new == ("Async runs 2.06x <!-- r.json:a.rows[k=x].v --> faster (error -11.0% "
                   "<!-- r.json:a.rows[k=x].e -->, 12,346 <!-- r.json:a.rows[k=x].n --> a step).\n"
                   "```text r.json:t\nA 1.50x\n```\nThe 1.90x above is prose.\n")  # fmt: skip
    assert len(changed) == 4
    assert check(new.replace("The 1.90x above is prose.\n", ""), tmp_path) == []
    assert refresh(new, tmp_path) == (new, [])
    assert refresh(page, tmp_path, only="other.json") == (page, [])  # another file's alone
