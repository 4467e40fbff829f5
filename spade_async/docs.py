"""The configuration reference (docs/configuration.md), generated from the config structs' field docs.

``python -m spade_async.docs`` rewrites the section between the markers in docs/configuration.md;
a test fails when the page and the structs disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spade_async.config import field_docs

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _fmt(value: object) -> str:
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value}`" if value is not None else "unset"


def config_reference() -> str:
    from spade_async.recipe import Config

    lines, section = [], None
    for path, tp, default, doc in field_docs(Config):
        head = path.split(".")[0] if "." in path else ""
        if head != section:
            section = head
            title = f"`[{head}]`" if head else "top level"
            lines += [
                "",
                f"#### {title}",
                "",
                "| key | type | default | meaning |",
                "|---|---|---|---|",
            ]
        key = path.split(".", 1)[1] if head else path
        lines.append(
            f"| `{key}` | {tp.replace('|', '/')} | {_fmt(default).replace('|', '/')} | {doc.replace('|', '/')} |"
        )
    return "\n".join(lines).strip() + "\n"


def render(readme: str) -> str:
    if START not in readme or END not in readme:
        raise SystemExit(f"{REFERENCE} lacks the markers {START} ... {END}")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{config_reference()}{END}{tail}"


def main() -> int:
    text = REFERENCE.read_text()
    new = render(text)
    if new != text:
        REFERENCE.write_text(new)
        print(f"updated the configuration reference in {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
