"""Hostile corpus for the surfaces that show or embed model-written text (issue 37).

Payloads (tests/hostile_surfaces/payloads.py: terminal escapes, rich markup, HTML, bidi,
Python breakouts) in every field of a run directory (hostile_run.py), through every
command that prints, renders or embeds them. Targets: nothing planted runs on the host
(a marker file), no raw control character reaches a terminal, no payload reaches the page
unescaped, no traceback. Damage to a run directory: tests/test_damaged_runs.py.
"""

from __future__ import annotations

import html.parser
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "hostile_surfaces"))
import hostile_run as H  # noqa: E402
import payloads as P  # noqa: E402

from spade_async.cli import main as spade  # noqa: E402
from spade_async.memory import package  # noqa: E402

PKG = "hostile_pkg"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("hostile")
    marker = tmp / "MARKER"
    return tmp / "run", marker, H.build(tmp / "run", marker)


@pytest.fixture
def no_sandbox_rewards(monkeypatch):
    async def none(records, seeds):  # the export's solution replay needs the sandbox: skip
        return {}

    monkeypatch.setattr(package, "solution_rewards", none)


IMPORT_ALL = r"""
import importlib, json, pathlib, sys
dest = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(dest))
for f in sorted(dest.rglob("*.py")):
    compile(f.read_text(), str(f), "exec")
import gymnasium
pkg = importlib.import_module(sys.argv[2])
out = {}
for gym_id, name in pkg.ENVIRONMENTS.items():
    assert gym_id in gymnasium.registry, gym_id
    m = importlib.import_module(name)
    out[m.METADATA["id"]] = [m.METADATA["skill"], m.ENV_CLASS, m.METADATA["hints"], m.__doc__,
                             m.SOURCE]
print(json.dumps(out))
"""


def test_export_embeds_every_payload_as_data(hostile, tmp_path, no_sandbox_rewards):
    """Compiling, importing the package (gymnasium registration) and every environment
    module runs nothing planted in skill, class name, hints, reason, ids, tool names or
    docstrings; each value comes back exactly."""
    root, marker, info = hostile
    dest = tmp_path / "out"
    assert spade(["memory", "export", str(dest), "--run", str(root), "--format", "gymnasium",
                  "--name", PKG]) == 0  # fmt: skip
    p = subprocess.run([sys.executable, "-c", IMPORT_ALL, str(dest), PKG], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert not marker.exists(), "planted text ran on the host"
    got = json.loads(p.stdout)
    recs = {r.id: r for r in info["records"]}
    assert set(got) == set(recs)
    for rid, (skill, cls, hints, doc, source) in got.items():
        rec = recs[rid]
        assert (skill, cls, hints, source) == (rec.skill, rec.env_class, rec.hints, rec.code)
        assert repr(rec.skill) in doc
    import tomllib

    assert tomllib.loads((dest / "pyproject.toml").read_text())["project"]["name"] == "hostile-pkg"
    readme = (dest / "README.md").read_text()
    assert "<img" not in readme and "<script" not in readme and not P.raw_controls(readme)
    assert spade(["memory", "export", str(tmp_path / "j"), "--run", str(root), "--format",
                  "jsonl"]) == 0  # fmt: skip
    assert not marker.exists()


PLAY = r"""
import importlib, sys
sys.path.insert(0, sys.argv[1])
pkg = importlib.import_module(sys.argv[2])
from hostile_pkg._gym import SpadeTextEnv
import warnings
warnings.simplefilter("ignore")
(module,) = pkg.ENVIRONMENTS.values()
env = SpadeTextEnv(module, sandbox=False)
env.reset(seed=3)
actions = env.solution()
env.reset(seed=3)
for a in actions:
    _, reward, term, trunc, _ = env.step(a)
    if term or trunc:
        break
assert term and reward >= 1.0, (reward, term)
print(importlib.import_module(module).__doc__)
"""


def test_an_honest_skill_with_a_backslash_compiles_and_plays(tmp_path, no_sandbox_rewards):
    from spade_async.memory.records import Origin, make_record
    from spade_async.memory.repair import write_store

    run = tmp_path / "run"
    rec = make_record(H.HONEST, origin=Origin(kind="pool"), valid=True, stage="ok",
                      skill="Planning\\Navigation", env_class="ModularLockEnv")  # fmt: skip
    write_store([rec], run / "memory.lmdb")
    assert spade(["memory", "export", str(tmp_path / "out"), "--run", str(run), "--format",
                  "gymnasium", "--name", PKG]) == 0  # fmt: skip
    p = subprocess.run([sys.executable, "-c", PLAY, str(tmp_path / "out"), PKG],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "'Planning\\\\Navigation'" in p.stdout


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = spade(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _commands(root: Path, tmp: Path, info: dict) -> list[list[str]]:
    rid, eid = info["records"][0].id, info["episodes"][0].id
    esc = P.TERMINAL["osc52_clipboard"] + P.TERMINAL["forged_line"]
    run = ["--run", str(root)]
    return [
        ["memory", "ls", *run], ["memory", "ls", *run, "--json"],
        ["memory", "show", rid, *run], ["memory", "show", rid, *run, "--json"],
        ["memory", "stats", *run], ["memory", "stats", *run, "--json"],
        ["memory", "show", "abcd" + esc, *run],  # an error quoting the argument
        ["memory", "show", "\udcff\udcfe\udcfd\udcfc", *run],  # argv bytes not UTF-8
        ["report", str(tmp / "\udcff") + esc], ["dashboard", str(tmp / "\udcff") + esc],
        ["memory", "export", str(tmp / "files"), *run],
        ["memory", "verify", str(root)], ["memory", "verify", str(root), "--json"],
        ["episode", "ls", str(root)], ["episode", "ls", str(root), "--json"],
        ["episode", "replay", str(root), eid], ["episode", "replay", str(root), eid, "--json"],
        ["episode", "replay", str(root), "s1" + esc],
        ["dashboard", str(root), "--once", "--width", "150"],
        ["report", str(root), "--out", str(tmp / "report")],
    ]  # fmt: skip


def test_no_command_prints_a_raw_control_character(hostile, tmp_path, capsys):
    root, marker, info = hostile
    for argv in _commands(root, tmp_path, info):
        code, out, err = _run(argv, capsys)
        assert code in (0, 1, 2), argv
        assert P.raw_controls(out) == [] and P.raw_controls(err) == [], (argv, out[-500:], err)
        assert "Traceback" not in err, (argv, err)
        if code == 2:
            assert err.count("\n") == 1 and not out, (argv, err)
    assert not marker.exists()
    files = sorted(p.name for p in (tmp_path / "files").iterdir())  # ids name files: all hex
    assert all(re.fullmatch(r"[0-9a-f]{64}\.py|manifest\.jsonl", f) for f in files)


def test_the_live_dashboard_on_a_terminal_writes_only_its_own_escapes(hostile):
    from rich.console import Console

    from spade_async.telemetry.dashboard import Dashboard
    from spade_async.telemetry.metrics import read_metrics

    root, _, info = hostile
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, color_system="truecolor", width=170)
    view = Dashboard(console, title=info["payloads"]["terminal/osc0_title"])
    for rec in read_metrics(root):
        view.update(rec)
        view.note(rec.get("message", "note"))
    console.print(view.render())
    out = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())  # rich's own colours (SGR)
    assert "\x1b" not in out and P.raw_controls(out) == []
    assert "[/]" in out  # a metric named [/] is shown, not parsed


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.handlers: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.handlers += [k for k, _ in attrs if k.startswith("on") or "javascript:" in str(_)]


SVG = {"svg", "g", "path", "defs", "clippath", "use", "text", "rect", "style", "metadata",
       "rdf:rdf", "cc:work", "dc:type", "dc:date", "dc:format", "dc:creator", "cc:agent",
       "dc:title", "polyline", "line", "circle", "tspan", "polygon"}  # fmt: skip
PAGE = {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "p",
        "main", "section", "div", "table", "tr", "th", "td", "details", "summary", "code",
        "pre", "ul", "li", "b", "span"}  # fmt: skip


def test_the_report_page_holds_every_payload_escaped(hostile, tmp_path, capsys):
    root, marker, info = hostile
    code, _, err = _run(["report", str(root), "--out", str(tmp_path)], capsys)
    assert code == 0 and "Traceback" not in err
    page = (tmp_path / "index.html").read_text()
    tags = _Tags()
    tags.feed(page)
    assert tags.tags <= PAGE | SVG, tags.tags - PAGE - SVG
    assert tags.handlers == []
    assert "could not be drawn" not in page  # every section drew, its figures' labels too
    for name, p in info["payloads"].items():
        if name.startswith("html/"):
            assert p not in page, name
    assert P.raw_controls(page.replace("\n", "")) == []  # bidi and C0/C1 shown, not raw
    assert "U+202E" in page  # the code view marks the override it holds
    assert not marker.exists()


def test_an_id_that_is_no_sha256_never_names_a_file(hostile, tmp_path, no_sandbox_rewards):
    """Defence in depth behind verify: the export functions skip a tampered id."""
    import msgspec

    root, marker, info = hostile
    bad = [msgspec.structs.replace(info["records"][0], id=i)
           for i in ("../../escaped", "/tmp/abs", "x" * 64, "A" * 64)]  # fmt: skip
    dest = tmp_path / "a" / "b"
    out = package.export_gymnasium(bad, dest, run_dir=root, name=PKG)
    assert out["environments"] == 0 and not list((dest / PKG / "envs").glob("env_*.py"))
    assert package.export_jsonl(bad, dest, run_dir=root)["environments"] == 0
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and "escaped" in p.name) == []
    assert not marker.exists()
