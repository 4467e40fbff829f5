"""The letter-window setting: the extractor, the game on hand-worked cases, the gates, the
prompt, the recipe checks, the character tokenizer, and ``spade demo --learning``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from spade_async import recipe
from spade_async.cli import demo
from spade_async.cli import train as train_cli
from spade_async.envs.validate import check_file
from spade_async.errors import ConfigError
from spade_async.settings import family
from spade_async.settings import letter_window as lw


def _env(letter: str):
    ns: dict = {}
    exec(compile(lw.build(letter), "<letter_window>", "exec"), ns)
    return ns["LetterWindowEnv"]()


def test_the_reply_names_the_width_or_nothing():
    assert (lw.width("a"), lw.width("q"), lw.width("z")) == (26, 10, 1)
    assert "WIDTH = 10" in lw.build("q") and lw.letter_of(lw.build("  q and more")) == "q"
    for reply in ("", "   ", "Q", "1", "\\boxed{q}", "é"):
        assert lw.build(reply) is None, reply
    assert family("letter_window").build is lw.build


def test_the_game_on_hand_worked_cases():
    env = _env("x")  # width 3
    env.reset(seed=7)
    start = random.Random(7).randrange(26)
    inside = "abcdefghijklmnopqrstuvwxyz"[(start + 2) % 26]
    outside = "abcdefghijklmnopqrstuvwxyz"[(start + 3) % 26]
    assert env.step(outside)[1:4] == (0.0, False, False)
    assert env.step(f" {inside} and more")[1:4] == (1.0, True, False)
    env.reset(seed=7)
    assert env.step("\\boxed{" + inside + "}")[1] == 1.0
    env.reset(seed=7)
    results = [env.step(a)[1:4] for a in (outside, "", "I am sure")]
    assert results[-1] == (0.0, False, True)  # the third attempt ends it, truncated
    wide = _env("a")
    wide.reset(seed=1)
    assert all(wide.step(c)[1] == 1.0 for c in "az")  # width 26: every letter is inside


@pytest.mark.parametrize("letter", ["a", "z"])
def test_built_files_pass_every_gate(tmp_path, letter):
    path = tmp_path / "env.py"
    path.write_text(lw.build(letter))
    verdict = check_file(path)
    assert verdict.valid and verdict.stage == "ok", verdict


def test_the_prompt_shows_memory_as_letters():
    text = lw.prompt(
        skill="Letter_Window",
        positives=[(lw.build("q"), 0.5, 0.1), ("class OtherEnv: pass", 0.4, 0.0)],
        negative=(lw.build("b"), "too easy: the agent won 100% of plays"),
        setting="games",
        document=None,
    )
    assert "Letter q worked: the agent won 50% (regret 0.10)." in text
    assert "Letter b did not work (too easy" in text and "OtherEnv" not in text
    assert text.endswith("Reply with the letter only.")


def test_bad_family_settings_fail_at_start_with_one_line():
    with pytest.raises(ConfigError, match="not a known environment family"):
        recipe.load(demo.LEARNING, ["designer.family=nope"])
    with pytest.raises(ConfigError, match="set designer.setting = 'games'"):
        recipe.load(demo.LEARNING, ["designer.setting=tool_use"])


def test_character_tokenizer_has_one_id_per_character():
    from transformers import AutoTokenizer

    from spade_async.models import tokenizer_dir
    from spade_async.settings.char_model import char_tokenizer

    template = AutoTokenizer.from_pretrained(tokenizer_dir("smollm2-135m-instruct")).chat_template
    tok = char_tokenizer(template)
    assert len(tok) == 101
    ids = tok("ab c\n", add_special_tokens=False).input_ids
    assert len(ids) == 5 and tok.decode(ids) == "ab c\n"
    assert len({tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"}) == 26
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert tok(chat, add_special_tokens=False).input_ids[0] == tok.convert_tokens_to_ids(
        "<|im_start|>"
    )


def test_demo_learning_runs_the_learning_recipe_on_the_char_model(monkeypatch, tmp_path):
    import spade_async.settings.char_model as cm

    seen = {}
    monkeypatch.setattr(cm, "char_model_dir", lambda path: Path(path))
    monkeypatch.setattr(train_cli, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert demo.main(["--learning", "--run-dir", str(tmp_path / "r")]) == 0
    argv = seen["argv"]
    assert argv[:3] == [str(demo.LEARNING), "--run-dir", str(tmp_path / "r")]
    assert argv[3] == "--set" and argv[4].startswith("model=") and "char-tiny-llama" in argv[4]
    assert recipe.load(demo.LEARNING).designer.family == "letter_window"


def test_the_designer_uses_the_family_for_prompt_and_extraction():
    import anyio
    import numpy as np

    from spade_async.roles import designer

    cfg = designer.DesignerConfig(family="letter_window", skills=("Letter_Window",))
    prompt, shown = designer.build_prompt(
        cfg, skill="Letter_Window", document=None, store=None, rng=np.random.default_rng(0)
    )
    assert prompt == lw.prompt(skill="Letter_Window") and shown == []
    source, verdict = anyio.run(designer._check, "```python\nclass XEnv: pass\n```", None, cfg)
    assert source is None and not verdict.valid
    assert verdict.reason == family("letter_window").no_parameter
