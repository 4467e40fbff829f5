"""extract_code: fenced blocks, several blocks, unfenced code, no code."""

from spade_async.envs.extract import extract_code

ENV = "class GuessEnv:\n    def reset(self, seed=None):\n        return 'o', {}\n"


def test_single_fenced_block():
    reply = f"Here is the environment:\n```python\n{ENV}```\nHope it helps."
    assert extract_code(reply) == ENV


def test_several_blocks_prefers_env_class_over_longer_helper():
    helper = "def helper():\n" + "    x = 1\n" * 20
    reply = f"```python\n{helper}```\nand\n```py\n{ENV}```\n```python\nprint('usage')\n```"
    assert extract_code(reply) == ENV


def test_several_blocks_without_env_takes_longest():
    reply = "```python\nx = 1\n```\n```python\ndef f():\n    return 2\n```"
    assert extract_code(reply) == "def f():\n    return 2\n"


def test_last_env_block_wins_when_revised():
    v2 = ENV.replace("'o'", "'o2'")
    reply = f"First try:\n```python\n{ENV}```\nFixed:\n```python\n{v2}```"
    assert extract_code(reply) == v2


def test_untagged_and_tilde_fences_and_unterminated():
    assert extract_code(f"```\n{ENV}```") == ENV
    assert extract_code(f"~~~python\n{ENV}~~~") == ENV
    assert extract_code(f"```python\n{ENV}") == ENV  # ran out of tokens


def test_other_languages_are_skipped():
    assert extract_code('```json\n{"a": 1}\n```') is None
    assert extract_code(f"```bash\nls\n```\n```python\n{ENV}```") == ENV


def test_unfenced_code_after_prose():
    reply = f"Sure, here it is.\n\nimport random\n\n{ENV}"
    assert extract_code(reply) == f"import random\n\n{ENV}"


def test_no_code():
    assert extract_code("") is None
    assert extract_code("I cannot write that environment, sorry.") is None
    assert extract_code("class is a word that, here, is not code at all") is None
