"""What an environment family is (a leaf: each family module imports it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """An environment family: its prompt and its extractor."""

    name: str
    prompt: Callable[..., str]  # designer_prompt's keyword arguments -> the designer's prompt
    build: Callable[[str], str | None]  # the designer's reply -> environment source, or None
    no_parameter: str  # the verdict's reason when ``build`` finds no parameter in a reply
