"""ToolUseBaseEnv: schema export, parsing, dispatch, tolerant scoring, truncation."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from spade_async.envs import tool_use
from spade_async.envs.tool_use import ToolUseBaseEnv


class CalcEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        self._tools = {
            "add": {
                "description": "Add two numbers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                    "required": ["a", "b"],
                },
            },
            "broken": {"description": "Always raises."},
        }
        self._expected_answer = "12.5"
        return "Add 5 and 7.5.", {}

    def tool_add(self, a, b):
        return str(a + b)

    def tool_broken(self):
        raise RuntimeError("boom")

    def solution(self):
        return [self.tool_call_action("add", a=5, b=7.5), self.answer_action("12.5")]


def test_get_tools_is_openai_function_schema():
    tools = CalcEnv().get_tools()
    assert [t["function"]["name"] for t in tools] == ["add", "broken"]
    assert all(t["type"] == "function" for t in tools)
    assert tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert tools[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    json.dumps(tools)  # serialisable for the chat template


def test_tool_call_dispatches_and_answer_scores():
    env = CalcEnv()
    obs, reward, term, trunc, _ = env.step(env.solution()[0])
    assert (obs, reward, term, trunc) == ("Tool result:\n12.5", 0.0, False, False)
    assert env._call_history[0]["arguments"] == {"a": 5, "b": 7.5}
    obs, reward, term, trunc, _ = env.step("I think <answer> 12.50 </answer>")
    assert (reward, term, trunc) == (1.0, True, False)


@pytest.mark.parametrize(
    ("answer", "ok"),
    [("12.5", True), ("12.505", True), ("$12.50", True), ("12.6", False), ("twelve", False)],
)
def test_numeric_tolerance(answer, ok):
    env = CalcEnv()
    assert env._check_answer(answer) is ok


def test_text_answers_are_case_insensitive():
    env = CalcEnv()
    env._expected_answer = "Zurich"
    assert env._check_answer(" zURICH ")
    assert not env._check_answer("Zürich")


@pytest.mark.parametrize(
    "action",
    [
        "",
        "no tags at all",
        "\\boxed{}",
        "<tool_call>{not json</tool_call>",
        "<tool_call>[1, 2]</tool_call>",
        '<tool_call>{"name": 3}</tool_call>',
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "add", "arguments": "{bad"}</tool_call>',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
        '<tool_call>{"name": "broken", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "__init__", "arguments": {}}</tool_call>',
        "<answer></answer>",
    ],
)
def test_malformed_actions_cost_point_one_and_never_raise(action):
    env = CalcEnv()
    obs, reward, term, trunc, info = env.step(action)
    assert reward == pytest.approx(-0.1)
    assert not term and not trunc
    assert isinstance(obs, str) and obs and isinstance(info, dict)


def test_openai_style_string_arguments_and_parameters_key():
    env = CalcEnv()
    call = {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}
    assert env.step(f"<tool_call>{json.dumps(call)}</tool_call>")[0].endswith("3")
    call = {"name": "add", "parameters": {"a": 2, "b": 2}}
    assert env.step(f"<tool_call>{json.dumps(call)}</tool_call>")[0].endswith("4")


def test_wrong_answer_continues_unless_attempts_are_limited():
    env = CalcEnv()
    assert env.step("<answer>3</answer>")[1:4] == (0.0, False, False)

    class OneShot(CalcEnv):
        max_answer_attempts = 1

    env = OneShot()
    assert env.step("<answer>3</answer>")[1:4] == (0.0, True, False)
    assert env.step("<answer>12.5</answer>")[1:3] == (0.0, True)  # the episode is over


def test_truncation_reveals_the_solution():
    env = CalcEnv(max_turns=2)
    env.step("<answer>1</answer>")
    obs, reward, term, trunc, _ = env.step("garbage")
    assert trunc and not term
    assert "Solution" in obs and env.solution()[0] in obs


def test_reset_clears_episode_state_even_when_subclass_forgets():
    env = CalcEnv(max_turns=2)
    env.step("x")
    env.step("x")
    assert env.done
    env.reset(1)
    assert (env.turn_count, env.done, env._call_history) == (0, False, [])
    assert env.step(env.solution()[0])[3] is False


def test_module_is_standard_library_only():
    """The sandbox injects this file into environments, which see only the stdlib."""
    tree = ast.parse(Path(tool_use.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
    }
    assert imported <= {"functools", "json", "re"}, imported


REFERENCE_STYLE = """
class LookupEnv(ToolUseBaseEnv):
    def __init__(self, max_turns=6, **kwargs):
        self.extra = "kept"
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        self._state = {"k": rng.randint(1, 9)}
        self._tools = {"read": {"description": "Read k.",
                                "parameters": {"type": "object", "properties": {}}}}
        self._expected_answer = self._state["k"]
        self._user_messages = ["read k", "answer k"]
        self._current_msg = 0
        return "Read k, then answer it." + self._obs_suffix(), {}

    def tool_read(self):
        self._current_msg = 1
        return str(self._state["k"])

    def solution(self):
        return ('<tool_call>{"name": "read", "arguments": {}}</tool_call>\\n'
                f"<answer>{self._expected_answer}</answer>")
"""


def test_reference_style_subclass_runs_unchanged():
    """Generated files rely on injection, ``_obs_suffix`` and the pending-step feedback."""
    import random

    namespace = {"ToolUseBaseEnv": ToolUseBaseEnv, "random": random}
    exec(REFERENCE_STYLE, namespace)
    env = namespace["LookupEnv"]()
    assert env.extra == "kept" and env.max_turns == 6
    obs, _ = env.reset(3)
    assert obs == "Read k, then answer it."
    assert "Step 1/2 is still pending: 'read k'" in env.step("<answer>0</answer>")[0]
    call, answer = env.solution().splitlines()
    assert env.step(call)[0] == f"Tool result:\n{env._expected_answer}"
    assert env.step(answer)[1:3] == (1.0, True)
