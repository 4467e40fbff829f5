"""Base class for tool-use environments (docs/environments.md, "Tool-use setting").

STANDARD LIBRARY ONLY: the sandbox injects this file's ``ToolUseBaseEnv`` into every
environment module's namespace, because the reference SPADE implementation's generated
tool-use files write ``class SomethingEnv(ToolUseBaseEnv):`` without importing it. Nothing
here may import ``spade_async`` or a third-party package.

The agent acts with one of::

    <tool_call>{"name": "tool_name", "arguments": {"key": "value"}}</tool_call>
    <answer>final result</answer>

A subclass implements ``reset(seed)`` (declare ``self._tools``, build ``self._state``, set
``self._expected_answer``), ``solution()`` (a list of actions: tool calls, then the answer,
so it replays) and one ``tool_<name>(**kwargs) -> str`` per tool; it may override
``_check_answer(answer)``. The base class provides ``get_tools()`` (OpenAI function
schemas, for ``apply_chat_template(tools=...)``) and ``step()``.

Rewards: a correct answer 1.0 (terminated); a wrong answer 0.0 and the episode goes on,
as in the reference, unless the subclass sets ``max_answer_attempts`` and they are used
up (then it terminates with 0.0); a tool call 0.0; a malformed action or a failing tool
call -0.1 (never an exception). At ``max_turns`` the episode is truncated and the
solution is revealed in the observation.
"""

import functools
import json
import re

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_NUMERIC_JUNK_RE = re.compile(r"[$,%\s]")

FORMAT_PENALTY = -0.1
NUMERIC_TOLERANCE = 0.01


class ToolUseBaseEnv:
    """Parses tool calls and answers, dispatches to ``tool_<name>``, scores answers."""

    max_answer_attempts = None  # None: unlimited wrong answers (the reference behaviour)

    def __init_subclass__(cls, **kwargs):
        """Wrap each subclass's ``reset`` so the per-episode counters always start clean."""
        super().__init_subclass__(**kwargs)
        original = cls.__dict__.get("reset")
        if original is None or getattr(original, "_clears_episode", False):
            return

        @functools.wraps(original)
        def reset(self, *args, **kw):
            self.turn_count = 0
            self.answer_attempts = 0
            self.done = False
            self._call_history = []
            return original(self, *args, **kw)

        reset._clears_episode = True
        cls.reset = reset

    def __init__(self, max_turns=10, **kwargs):
        self.max_turns = max_turns
        self.turn_count = 0
        self.answer_attempts = 0
        self.done = False
        self._tools = {}  # name -> {"description": str, "parameters": JSON schema}
        self._state = {}  # the simulated backend
        self._call_history = []  # [{"name", "arguments", "result"}]
        self._expected_answer = None
        self.reset()

    # ----------------------------------------------------------- subclass interface
    def reset(self, seed=None):
        raise NotImplementedError("a tool-use environment must implement reset(seed)")

    def solution(self):
        raise NotImplementedError("a tool-use environment must implement solution()")

    def _check_answer(self, answer):
        """Tolerant comparison: case-insensitive text, or numbers within 0.01."""
        got, want = str(answer).strip(), str(self._expected_answer).strip()
        if got.lower() == want.lower():
            return True
        try:
            got_num = float(_NUMERIC_JUNK_RE.sub("", got))
            want_num = float(_NUMERIC_JUNK_RE.sub("", want))
        except ValueError:
            return False
        return abs(got_num - want_num) <= NUMERIC_TOLERANCE

    def _incorrect_answer_feedback(self):
        """Observation after a wrong answer. Multi-step tasks that keep ``_user_messages``
        (a list of instructions) and ``_current_msg`` (the index of the pending one) get told
        which step is still open, instead of an information-free "incorrect"."""
        text = "Incorrect answer. Keep using the tools."
        steps, index = getattr(self, "_user_messages", None), getattr(self, "_current_msg", None)
        if isinstance(steps, (list, tuple)) and isinstance(index, int) and 0 <= index < len(steps):
            text += f" Step {index + 1}/{len(steps)} is still pending: {steps[index]!r}."
        return text

    def _obs_suffix(self):
        """Kept for generated files that append it in reset(); tools travel via get_tools()."""
        return ""

    # ----------------------------------------------------------- helpers for subclasses
    @staticmethod
    def tool_call_action(name, /, **arguments):
        """The action string that calls one tool (what ``solution()`` lists)."""
        return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

    @staticmethod
    def answer_action(answer):
        return "<answer>" + str(answer) + "</answer>"

    # ----------------------------------------------------------- provided by the base
    def get_tools(self):
        """Tool schemas in OpenAI function-calling format."""
        tools = []
        for name, info in self._tools.items():
            parameters = info.get("parameters") or {"type": "object", "properties": {}}
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": info.get("description", ""),
                        "parameters": parameters,
                    },
                }
            )
        return tools

    def execute_tool(self, name, arguments):
        """Run one tool; returns ``{"output": str, "returncode": 0 | 1}``."""
        method = getattr(self, "tool_" + str(name), None)
        if name not in self._tools or not callable(method):
            available = ", ".join(sorted(self._tools)) or "none"
            return {"output": f"Unknown tool '{name}'. Available: {available}", "returncode": 1}
        try:
            result = str(method(**arguments))
        except Exception as exc:  # a bad argument is feedback for the agent, not a crash
            return {"output": f"Error calling {name}: {type(exc).__name__}: {exc}", "returncode": 1}
        self._call_history.append({"name": name, "arguments": arguments, "result": result})
        return {"output": result, "returncode": 0}

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn_count += 1
        action = action if isinstance(action, str) else str(action)

        answer = _ANSWER_RE.search(action)
        if answer is not None and not answer.group(1).strip():
            return self._maybe_truncate("Format error: the <answer> is empty.", FORMAT_PENALTY)
        if answer is not None:
            if self._check_answer(answer.group(1).strip()):
                self.done = True
                return "Correct!", 1.0, True, False, {"answer": "correct"}
            self.answer_attempts += 1
            limit = self.max_answer_attempts
            if limit is not None and self.answer_attempts >= limit:
                self.done = True
                return "Incorrect answer, and no attempts are left.", 0.0, True, False, {}
            return self._maybe_truncate(self._incorrect_answer_feedback(), 0.0)

        call = _TOOL_CALL_RE.search(action)
        if call is None:
            message = (
                'Format error: call a tool with <tool_call>{"name": ..., "arguments": '
                "{...}}</tool_call> or submit <answer>...</answer>."
            )
            return self._maybe_truncate(message, FORMAT_PENALTY)
        name, arguments, error = self._parse_call(call.group(1))
        if error:
            return self._maybe_truncate("Format error: " + error, FORMAT_PENALTY)
        result = self.execute_tool(name, arguments)
        reward = 0.0 if result["returncode"] == 0 else FORMAT_PENALTY
        return self._maybe_truncate("Tool result:\n" + result["output"], reward)

    def close(self):
        pass

    # ----------------------------------------------------------- internals
    @staticmethod
    def _parse_call(text):
        """-> (name, arguments, error); accepts "arguments" or "parameters", dict or JSON."""
        try:
            call = json.loads(text.strip())
        except ValueError as exc:
            return None, None, f"the tool call is not valid JSON ({exc})."
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None, None, 'the tool call must be a JSON object with a string "name".'
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI style: arguments as a JSON string
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                return None, None, '"arguments" is a string that is not valid JSON.'
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return None, None, '"arguments" must be a JSON object.'
        return call["name"], arguments, None

    def _maybe_truncate(self, observation, reward):
        if self.turn_count < self.max_turns:
            return observation, reward, False, False, {}
        self.done = True
        try:
            steps = self.solution()
            shown = "\n".join(steps) if isinstance(steps, (list, tuple)) else str(steps)
        except Exception as exc:
            shown = f"(solution unavailable: {type(exc).__name__})"
        text = f"{observation}\n\nOut of turns. Solution:\n{shown}"
        return text, reward, False, True, {}
