"""The answer an agent's reply gives: the content of its last ``\\boxed{...}`` (braces balanced).

Standard library only, and copied verbatim into the environment sources that ``rg:`` writes
(``inspect.getsource``), so the parent that checks a dataset's own answers
and the sandboxed environment that scores the agent read a reply the same way.
"""


def boxed(text):
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), or None."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len("\\boxed{") : i].strip()
            i += 1
        start = text.rfind("\\boxed{", 0, start)
    return None


def balanced(text):
    """Whether ``\\boxed{text}`` gives ``text`` back (its braces pair up)."""
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0
