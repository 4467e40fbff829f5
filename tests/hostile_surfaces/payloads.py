"""Hostile text for the surfaces that show or embed model-written text (issue 37).

Four classes, each aimed at one way out: a terminal (control characters and escape
sequences), a rich view (markup), an HTML page (tags, attributes, entities), generated
Python source (string and docstring breakouts that touch ``MARKER`` when they run). Bidi
and invisible controls target code views (Trojan Source, CVE-2021-42574). ``MARKER`` is
replaced by a path the tests watch: if it exists afterwards, planted text ran.
"""

from __future__ import annotations

TERMINAL = {
    "osc52_clipboard": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "osc0_title": "\x1b]0;owned\x1b\\",
    "csi_6n_reply": "\x1b[6n",
    "csi_clear": "\x1b[2J\x1b[H",
    "c1_csi": "\x9b31m",
    "c1_osc": "\x9d0;t\x9c",
    "nul": "a\x00b",
    "bel_bs_cr": "ok\x07\x08\rFORGED",
    "forged_line": "x\nspade: error: FORGED LINE",
    "del_nel": "\x7f\x85",
    "separators": "a\u2028b\u2029c",
    "vt_ff": "\x0b\x0c",
}
MARKUP = {
    "rich_close": "[/]",
    "rich_style": "[bold red]loud[/bold red]",
    "rich_link": "[link=file:///etc/passwd]x[/link]",
    "rich_unclosed": "[/bold",
}
HTML = {
    "img_onerror": "<img src=x onerror=alert(1)>",
    "script": "</code></pre><script>alert(document.domain)</script>",
    "attr_break": '"><svg onload=alert(1)>',
    "single_quote": "'><iframe src=javascript:alert(1)>",
    "comment": "<!-- --><b>",
    "style_break": "</style><body onload=alert(1)>",
}
BIDI = {
    "rlo": "user\u202e \u2066// admin\u2069 \u2066",
    "isolates": "\u2066\u2067\u2068\u2069",
    "marks": "\u200e\u200f\u061c",
    "invisible": "zero\u200bwidth\u2060join\ufeff",
}
BREAKOUT = {
    "triple_double": '"""; __import__("pathlib").Path(MARKER).touch(); """',
    "triple_single": "'''; __import__('pathlib').Path(MARKER).touch(); '''",
    "both_quotes": '\'"""; __import__("pathlib").Path(MARKER).touch() #',
    "newline": 'x\n__import__("pathlib").Path(MARKER).touch()\n',
    "fstring": '{__import__("pathlib").Path(MARKER).touch()}',
    "format": "%(x)s {0} {x!r}",
    "trailing_backslash": "end\\",
    "honest_backslash": "Planning\\Navigation",
}


def flat(marker: str) -> dict[str, str]:
    """Every payload by "class/name", ``MARKER`` replaced by a quoted ``marker``."""
    out = {}
    for cls, group in (("terminal", TERMINAL), ("markup", MARKUP), ("html", HTML),
                       ("bidi", BIDI), ("breakout", BREAKOUT)):  # fmt: skip
        for name, p in group.items():
            out[f"{cls}/{name}"] = p.replace("MARKER", repr(marker))
    return out


def storable_skill(p: str) -> bool:
    """A payload ``records.skill_problem`` lets into a store (one clean line, short)."""
    from spade_async.memory.records import skill_problem

    return skill_problem(p) is None


def raw_controls(out: str) -> list[str]:
    """Characters that must never reach a terminal raw (what ``safe_text.term`` escapes;
    a tab is harmless and code keeps it)."""
    from spade_async.safe_text import DANGEROUS

    return sorted({f"U+{ord(c):04X}" for c in DANGEROUS.findall(out)})
