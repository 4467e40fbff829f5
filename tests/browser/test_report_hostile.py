"""`spade report` of a hostile run (tests/hostile_surfaces: HTML, script, bidi, markup and
breakout payloads in every field) in headless Chromium (`make test-browser`): no dialog
opens, nothing runs or logs an error, nothing is fetched, and the payloads read as text."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "hostile_surfaces"))
import hostile_run as H  # noqa: E402
from test_report_page import _browser_path  # noqa: E402

from spade_async.cli import main as spade  # noqa: E402

pytestmark = pytest.mark.browser


def test_a_hostile_run_opens_no_dialog_and_logs_no_error(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    info = H.build(tmp_path / "run", tmp_path / "MARKER")
    assert spade(["report", str(tmp_path / "run"), "--out", str(tmp_path / "page")]) == 0
    path = tmp_path / "page" / "index.html"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_browser_path(), args=["--no-sandbox"])
        try:
            ctx = browser.new_context(viewport={"width": 1300, "height": 900}, offline=True,
                                      java_script_enabled=True)  # fmt: skip
            page = ctx.new_page()
            problems: list[str] = []
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)  # fmt: skip
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("request", lambda r: problems.append(f"request: {r.url}")
                    if r.url != path.as_uri() else None)  # fmt: skip
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_timeout(500)
            assert problems == [], problems
            scripts = page.evaluate("() => document.querySelectorAll('script, iframe, img').length")
            assert scripts == 0
            body = page.inner_text("body")
            assert info["payloads"]["html/img_onerror"] in body  # shown as text
            assert "U+202E" in body  # the override in the code view is marked, not obeyed
        finally:
            browser.close()
    assert not (tmp_path / "MARKER").exists()
