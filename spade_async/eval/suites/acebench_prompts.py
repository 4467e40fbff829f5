"""Prompts of the ACEBench agent suite: ACEBench's instructions, in our own words.

The agent's call format, roles and "finish conversation" signal, and the user simulator's
rules are the facts of ACEBench's ``APIModel_agent``/``APIModel_user`` prompts; the domain
rules of the multi-turn agent (current time, policies) are read from the user's checkout
(``acebench_env``).
"""

from __future__ import annotations

__all__ = ["STEP_SYSTEM", "STEP_USER", "TURN_SYSTEM", "TURN_USER", "NO_CALLS", "SIM_OPENING",
           "simulator_prompt"]  # fmt: skip

_FORMAT = """\
1. When what you know is enough to call an API, reply with the call or calls only, written \
[ApiName(key1='value1', key2='value2', ...)]: the real API name, parameter names and \
values; the reply starts with "[" and ends with "]"; several calls are separated by commas. \
Add no explanation, no prompt and no result.
   - A parameter is optional unless its description says otherwise: include the \
parameters the user mentioned and leave the others out.
   - Where a parameter's description sets no format, use the user's own words as its value.
"""
_ROLES = """\
Roles:
user: the person asking
agent: you, the AI system that calls APIs
execution: runs the calls and returns their results
"""

STEP_SYSTEM = (
    "You are the agent, an AI system. From the API documentation and the dialogue so far "
    "(steps 1..t), write the agent's message for step t+1.\n"
    + _FORMAT
    + """\
2. A task whose steps depend on each other is done one step at a time: read each execution \
result, then decide the next call.
3. As a rule, call one function at a time.

When an API call is needed, write only the call, in the format above.
When you judge the task complete, reply "finish conversation" to end the dialogue.

"""
    + _ROLES
)
STEP_USER = "The APIs you can call (JSON): {functions}\nThe dialogue so far:\n{history}"

TURN_SYSTEM = (
    "You are the agent, an AI system. From the API documentation and the dialogue so far "
    "(steps 1..t), write the agent's message for step t+1.\n"
    + _FORMAT
    + """\
2. When information is missing, ask the user for it; never answer in the user's place.

When an API call is needed, write only the call, in the format above.

"""
    + _ROLES
    + "\nThe rules to follow:\n"
)
TURN_USER = "The APIs you can use:\n{functions}\n\nThe dialogue so far (steps 1..t):\n{history}"

NO_CALLS = "Do not ask me questions; solve the task with what you already know."
SIM_OPENING = "What can I help you with today?"

_SIM_COMMON = """\
You play a user who talks with an assistant agent.

Your instruction: {instruction}

How to play:
- Each message is one line, written as the user.
- Do not reveal the whole instruction at once; give only what the current step needs.
"""
_SIM_BASE = """\
- Give everything the current step needs, though: to add a reminder, its title, \
description and time.
- Never make up what the instruction does not say (a takeout order it does not name, for \
example).
- When the agent asks whether you need anything else, check that every main task of the \
instruction is done; if one is not, ask for it next.
- Names in the instruction are full names.
- When the agent asks which message to delete, answer as the instruction says.
- Do not offer the agent help; answer its questions from the instruction only, and make up \
nothing you do not know.
- When every task is done, send a line that says only 'finish conversation'.
"""
_SIM_TRAVEL = """\
- Never make up what the instruction does not say: asked for an order ID it does not give, \
say you do not remember it or do not have one.
- When the agent asks you to confirm something, confirm or not as the instruction decides.
- Do not repeat the instruction word for word; say the same in your own words.
- Keep the dialogue natural, and keep the personality the instruction describes.
- When the goal of the instruction is reached, send a line that says only \
'finish conversation'.
- If the instruction asks for a round-trip flight, say at the very start that you want to \
book a round-trip flight.
"""


def simulator_prompt(instruction: str, involved: list[str]) -> str:
    """The simulator's system prompt: the phone-platform rules, or the travel ones."""
    rules = _SIM_TRAVEL if "Travel" in involved and "BaseApi" not in involved else _SIM_BASE
    return _SIM_COMMON.format(instruction=instruction) + rules
