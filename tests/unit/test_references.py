"""Every reference the repository makes resolves: Markdown links and anchors, repository paths
cited in Markdown, and `.md` files cited from code, configs and docs. Also the size rules of the
front page and the docs pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", ".venv-latest", ".venv-interop", "node_modules", "runs", ".whl", "fixtures"}
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
MD_NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)(#[\w-]+)?\b")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
ROOTS = ("spade_async/", "configs/", "bench/", "tests/", "kernels/", "docs/", "requirements/")
GENERATED_OR_TABLES = {"configuration.md", "fidelity.md"}


def _files(*suffixes: str) -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(part in SKIP_DIRS or part.startswith(".pytest") for part in rel[:-1]):
            continue
        if path.is_file() and path.suffix in suffixes:
            out.append(path)
    return sorted(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def _resolve(name: str, source: Path) -> Path | None:
    for base in (source.parent, ROOT, ROOT / "docs"):
        candidate = (base / name).resolve()
        if candidate.exists():
            return candidate
    return None


def broken_links(md: Path) -> list[str]:
    bad = []
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            bad.append(f"{md.relative_to(ROOT)}: link to missing {target}")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{md.relative_to(ROOT)}: no heading for #{frag} in {dest.relative_to(ROOT)}")
    return bad


def broken_paths(md: Path) -> list[str]:
    """Backticked repository paths (`spade_async/x.py`, `configs/y.toml`, `docs/z.md`) exist."""
    bad = []
    for span in CODE_SPAN.findall(md.read_text()):
        for token in span.split():
            token = token.strip(",;:()")
            if not token.startswith(ROOTS) or re.search(r"[*{}<>\[\]$|]|\.\.\.", token):
                continue
            token = token.split("::")[0]
            if not (ROOT / token).exists() and not (ROOT / token.rstrip("/")).exists():
                bad.append(f"{md.relative_to(ROOT)}: cites missing `{token}`")
    return bad


def broken_md_names(source: Path) -> list[str]:
    """A `.md` file named in code, a config or a doc exists, and so does its anchor."""
    bad = []
    for name, frag in MD_NAME.findall(source.read_text(errors="replace")):
        if name.startswith("http") or "*" in name:
            continue
        found = _resolve(name, source)
        if found is None:
            bad.append(f"{source.relative_to(ROOT)}: cites missing {name}")
        elif frag and frag[1:] not in anchors(found):
            bad.append(f"{source.relative_to(ROOT)}: no heading for {frag} in {name}")
    return bad


def test_markdown_links_and_anchors_resolve():
    bad = [b for md in _files(".md") for b in broken_links(md)]
    assert not bad, "\n".join(bad)


def test_repository_paths_cited_in_markdown_exist():
    bad = [b for md in _files(".md") for b in broken_paths(md)]
    assert not bad, "\n".join(bad)


def test_markdown_files_cited_anywhere_exist():
    code = [f for f in _files(".py", ".toml", ".sh", ".txt") if f.relative_to(ROOT).parts[0] != "tests"]
    bad = [b for f in _files(".md") + code for b in broken_md_names(f)]
    bad += [b for b in broken_md_names(ROOT / "Makefile")]
    assert not bad, "\n".join(bad)


def test_the_checks_fail_on_a_missing_file_and_a_missing_anchor(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page.write_text(
        "[ok](other.md#a-section) [gone](missing.md) [no anchor](other.md#nowhere)\n"
        "See NOPE.md and `spade_async/no_such_module.py`.\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        links, paths, names = broken_links(page), broken_paths(page), broken_md_names(page)
    finally:
        ROOT = saved
    assert any("missing.md" in b for b in links) and any("#nowhere" in b for b in links)
    assert not any("a-section" in b for b in links)
    assert paths == ["page.md: cites missing `spade_async/no_such_module.py`"]
    assert any("NOPE.md" in b for b in names)


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 12 * 1024, "README.md over 12 KB: move detail into docs/"
    assert "<!--" not in text, "no markers a reader cannot follow"
    assert not re.search(r"\bissues? #?\d+", text, flags=re.I), "no issue numbers in the README"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_docs_pages_stay_readable(page):
    if page.name not in GENERATED_OR_TABLES:
        assert len(page.read_bytes()) <= 15 * 1024, f"{page.name} over 15 KB: split the topic"
    assert not re.search(r"\bissues? #?\d+", page.read_text(), flags=re.I), page.name
