"""The configuration reference (docs/configuration.md) matches the config structs (regenerate with
``python -m spade_async.docs``), and every field has a one-line doc."""

from spade_async.config import field_docs
from spade_async.docs import REFERENCE, render
from spade_async.recipe import Config

README = REFERENCE.parents[1] / "README.md"


def test_config_reference_is_current():
    text = REFERENCE.read_text()
    assert render(text) == text, "run: python -m spade_async.docs"


def test_every_config_field_is_documented():
    missing = [path for path, _, _, doc in field_docs(Config) if not doc.strip()]
    assert not missing, missing


def test_readme_starts_with_the_two_setup_commands():
    lines = README.read_text().splitlines()
    block = lines[lines.index("```sh") + 1 : lines.index("```sh") + 3]
    assert [b.split("#")[0].strip() for b in block] == ["make demo", "make test"]
