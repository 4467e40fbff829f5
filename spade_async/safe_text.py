"""Untrusted text on its way out: to a terminal, a rich view, a JSON line or an HTML page.

Model-written text (environment code, skills, class names, hints, validation reasons,
environment error messages) and run-directory contents (metric names, ids, statuses, a
tampered record) are untrusted. Every command that shows them passes them through one of
these helpers, which make the dangerous characters *visible* instead of dropping them:

- ``term(s)``: one terminal line. C0 controls (ESC, so OSC 52 clipboard writes, OSC 0
  titles, CSI 6n terminal replies; BEL, BS, CR, NUL), DEL, C1 controls (U+0080-U+009F: an
  8-bit CSI), newlines (a forged output line), bidirectional controls (Trojan Source,
  CVE-2021-42574), zero-width and other invisible format characters, line/paragraph
  separators and lone surrogates become Python-style escapes (``\\x1b``, ``\\u202e``).
  ``term(s, multiline=True)`` keeps newlines and tabs (a code view).
- ``text(s)``: a rich ``Text`` of ``term(s)``: never parsed as rich markup (``[/]``).
- ``markup(s)``: ``term(s)`` escaped for a rich markup string.
- ``json_line(obj)``: JSON for a terminal: the same characters as ``\\uXXXX`` escapes
  (still valid JSON, the same value once decoded).
- ``html_text(s)``: HTML-escaped (quotes included), with bidi and invisible controls shown
  as a marked ``U+XXXX`` (so a code view cannot reorder what it shows).

Text entering the system is checked where it enters (``spade_async.memory.records``'s
``record_problem``); these helpers are for leaving.
"""

from __future__ import annotations

import html
import re
from typing import Any

__all__ = ["DANGEROUS", "term", "text", "markup", "json_line", "html_text", "is_clean"]

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_INVISIBLE = "\u00ad\u180e\u200b-\u200d\u2060-\u2064\ufeff\ufff9-\ufffb"
# C0 but tab/newline, DEL, C1, bidi, invisible format characters, separators, surrogates
DANGEROUS = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}{_INVISIBLE}\u2028\u2029\ud800-\udfff]")
_LINE = re.compile(f"[\t\n]|{DANGEROUS.pattern}")


def _escape(m: re.Match) -> str:
    c = m.group()
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def term(value: Any, *, multiline: bool = False, limit: int | None = None) -> str:
    """``value`` as text safe to print on a terminal (see the module doc)."""
    s = value if isinstance(value, str) else str(value)
    if limit is not None and len(s) > limit:
        s = s[:limit] + "…"
    return (DANGEROUS if multiline else _LINE).sub(_escape, s)


def is_clean(s: str, *, multiline: bool = False) -> bool:
    """Whether ``s`` holds none of the characters ``term`` would escape."""
    return (DANGEROUS if multiline else _LINE).search(s) is None


def text(value: Any, style: str = "", *, multiline: bool = False):
    """A rich ``Text`` (no markup parsing) of ``term(value)``."""
    from rich.text import Text

    return Text(term(value, multiline=multiline), style=style)


def markup(value: Any) -> str:
    """``term(value)`` escaped for use inside a rich markup string."""
    from rich.markup import escape

    return escape(term(value))


def _json_escape(m: re.Match) -> str:
    return f"\\u{ord(m.group()):04x}"


def json_line(obj: Any) -> str:
    """``obj`` as one JSON line, every character ``term`` escapes written as ``\\uXXXX``."""
    import msgspec

    try:
        raw = msgspec.json.encode(obj).decode()
    except (UnicodeEncodeError, TypeError):  # a lone surrogate: the stdlib escapes it
        import json

        raw = json.dumps(msgspec.to_builtins(obj), ensure_ascii=True, separators=(",", ":"))
    return DANGEROUS.sub(_json_escape, raw)  # JSON's own escapes already cover C0 < 0x20


_HTML_MARK = re.compile(f"[{_BIDI}{_INVISIBLE}\u2028\u2029]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def html_text(value: Any) -> str:
    """``value`` HTML-escaped (``&<>"'``), bidi/invisible controls shown as ``U+XXXX``."""
    s = value if isinstance(value, str) else str(value)
    s = s.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates: visible
    out = html.escape(s, quote=True)
    return _HTML_MARK.sub(
        lambda m: f'<span class="ctl" title="a control character">U+{ord(m.group()):04X}</span>',
        out,
    )
