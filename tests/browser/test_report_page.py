"""`spade report`'s page in a real headless browser (`make test-browser`): Debian's
chromium-headless-shell (or chromium) driven by Playwright's Python package, which brings
no browser build of its own. It loads the page from disk with the network cut off and
checks that nothing logs a console error, raises, or asks for a resource; every figure
must be laid out with a visible size. ``SPADE_SCREENSHOT_DIR`` keeps full-page screenshots."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from spade_async.cli import main as spade

FIXTURE = Path(__file__).parents[1] / "fixtures" / "demo_run"
pytestmark = pytest.mark.browser


def _browser_path() -> str:
    for name in ("chromium-headless-shell", "chromium"):
        if path := shutil.which(name):
            return path
    pytest.fail("no chromium-headless-shell or chromium on PATH; run `make test-browser`")


def _pages(tmp_path: Path) -> dict[str, Path]:
    out = {}
    full = tmp_path / "full"
    assert spade(["report", str(FIXTURE), "--out", str(full), "--compare", str(FIXTURE)]) == 0
    out["full"] = full / "index.html"
    partial = tmp_path / "partial-run"
    shutil.copytree(FIXTURE, partial)
    shutil.rmtree(partial / "memory.lmdb")
    (partial / "metrics.jsonl").write_bytes((partial / "metrics.jsonl").read_bytes()[:-200])
    assert spade(["report", str(partial), "--out", str(tmp_path / "partial")]) == 0
    out["partial"] = tmp_path / "partial" / "index.html"
    return out


def test_report_renders_without_console_errors(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    shots = os.environ.get("SPADE_SCREENSHOT_DIR")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_browser_path(), args=["--no-sandbox"])
        try:
            for name, path in _pages(tmp_path).items():
                ctx = browser.new_context(viewport={"width": 1300, "height": 900}, offline=True)
                page = ctx.new_page()
                problems: list[str] = []
                page.on("console", lambda m, out=problems: out.append(f"console {m.type}: {m.text}")
                        if m.type in ("error", "warning") else None)  # fmt: skip
                page.on("pageerror", lambda e, out=problems: out.append(f"page error: {e}"))
                page.on("request", lambda r, out=problems, me=path.as_uri():
                        out.append(f"request: {r.url}") if r.url != me else None)  # fmt: skip
                page.goto(path.as_uri(), wait_until="load")
                sizes = page.evaluate(
                    "() => Array.from(document.querySelectorAll('svg'), s => "
                    "[s.getBoundingClientRect().width, s.getBoundingClientRect().height])"
                )
                assert problems == [], (name, problems)
                assert sizes and all(w > 100 and h > 50 for w, h in sizes), (name, sizes)
                assert page.title().startswith("spade report")
                headings = page.locator("h2").all_inner_texts()
                assert "Where the time goes" in headings and "Episode replay" in headings
                if name == "full":
                    assert len(sizes) >= 12 and any(h.startswith("Compared with") for h in headings)
                else:
                    assert "Missing or partial" in headings
                if shots:
                    Path(shots).mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(Path(shots) / f"report-{name}.png"), full_page=True)
                ctx.close()
        finally:
            browser.close()
