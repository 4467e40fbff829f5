"""Rewrite the cited figures of a docs page from the saved bench results.

A page cites each figure as ``FIGURE<!-- FILE.json:PATH -->`` (and a whole block as a
fenced ```` ```text FILE.json:PATH ```` block); ``tests/test_throughput_doc.py`` fails when
a figure and its saved value disagree. After a rerun of a bench, this puts the saved values
in place of the old figures, each with the decimals, sign and unit it was written with, and
each cited block's text; nothing else on the page is touched (the prose that reads the
figures is the author's to reread).

    python bench/doc_figures.py docs/throughput.md [--check] [--only simulate_placement.json]

--check: print the figures that would change and exit 1 if any would (nothing written).
--only FILE.json: only the citations of that saved file (a page citing several files whose
owners rerun them apart).
The last line printed is one JSON object: the page, the figures cited, the ones changed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REF = re.compile(r"(True|False|[+-]?[\d,]*\.?\d+)(x|%| s)?(\s*)<!-- ([\w.]+\.json):(\S+) -->")
BLOCK = re.compile(r"```text ([\w.]+\.json):(\S+)\n(.*?)```", re.DOTALL)


def resolve(data, path: str):
    """``a.b.0.c`` keys and indices; ``rows[split=4+4,schedule=async].x``: the one item of a
    list whose fields match."""
    for part in re.findall(r"[^.\[\]]+(?:\[[^\]]*\])?", path):
        m = re.fullmatch(r"([^\[]+)(?:\[([^\]]*)\])?", part)
        key, sel = m.group(1), m.group(2)
        data = data[int(key)] if isinstance(data, list) else data[key]
        if sel:
            want = dict(kv.split("=", 1) for kv in sel.split(","))
            hits = [r for r in data if all(str(r.get(k)) == v for k, v in want.items())]
            if len(hits) != 1:
                raise KeyError(f"{path}: {len(hits)} items match [{sel}]")
            data = hits[0]
    return data


def shown(old: str, unit: str, value) -> str:
    """``value`` written as ``old`` was: its decimals, a leading + if it had one, thousands
    commas if it had them; a ``%`` figure is the value x 100. A ``True``/``False`` figure
    (a target's ``met``) cites a boolean."""
    if old in ("True", "False"):
        if not isinstance(value, bool):
            raise TypeError(f"a True/False figure cites a {type(value).__name__}: {value!r}")
        return str(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"a figure cites a {type(value).__name__}, not a number: {value!r}")
    v = float(value) * (100 if unit == "%" else 1)
    decimals = len(old.split(".")[1]) if "." in old else 0
    text = f"{v:{',' if ',' in old else ''}.{decimals}f}"
    return f"+{text}" if old.startswith("+") and v >= 0 else text


def refresh(text: str, results: Path = RESULTS, only: str = "") -> tuple[str, list[str]]:
    """``text`` with every cited figure and block from ``results`` (``only``: of that file
    alone); the changes, one line each."""
    cache: dict[str, object] = {}
    changed: list[str] = []

    def saved(name: str):
        if name not in cache:
            cache[name] = json.loads((results / name).read_text())
        return cache[name]

    def block(m: re.Match) -> str:
        name, path, body = m.groups()
        if only and name != only:
            return m.group(0)
        new = str(resolve(saved(name), path)).rstrip("\n") + "\n"
        if new != body:
            changed.append(f"block {name}:{path}")
        return f"```text {name}:{path}\n{new}```"

    def figure(m: re.Match) -> str:
        old, unit, gap, name, path = m.groups()
        if only and name != only:
            return m.group(0)
        new = shown(old, unit or "", resolve(saved(name), path))
        if new != old:
            changed.append(f"{old}{unit or ''} -> {new}{unit or ''}  ({name}:{path})")
        return f"{new}{unit or ''}{gap}<!-- {name}:{path} -->"

    parts = []
    last = 0
    for m in BLOCK.finditer(text):  # figures outside the blocks; the blocks whole
        parts.append(REF.sub(figure, text[last : m.start()]))
        parts.append(block(m))
        last = m.end()
    parts.append(REF.sub(figure, text[last:]))
    return "".join(parts), changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("page", type=Path, help="a docs page citing bench/results/*.json")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 on a change")
    ap.add_argument("--only", default="", metavar="FILE.json", help="that file's citations alone")
    args = ap.parse_args()
    if not args.page.is_file():
        sys.exit(f"doc_figures: no page {args.page}: give a docs/*.md path")
    text = args.page.read_text()
    try:
        new, changed = refresh(text, only=args.only)
    except (KeyError, IndexError, TypeError, FileNotFoundError) as exc:
        sys.exit(f"doc_figures: {args.page}: {exc} (the page cites what the results lack)")
    for line in changed:
        print(line, file=sys.stderr)
    if not args.check and new != text:
        args.page.write_text(new)
    cited = len(REF.findall(text)) + len(BLOCK.findall(text))
    print(json.dumps({"page": str(args.page), "cited": cited, "changed": len(changed),
                      "written": not args.check and new != text}))  # fmt: skip
    if args.check and changed:
        sys.exit(1)


if __name__ == "__main__":
    main()
