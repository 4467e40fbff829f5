"""BFCL-v4 as BFCL's own harness runs it for the reference's model handle.

The reference scores its "BFCL-v4" column with ``bfcl_eval generate/evaluate --model
Qwen/Qwen3-4B-Instruct-2507-FC --test-category non_live,live,multi_turn`` and reads
"Overall Acc" (``eval_offline/suites/bfcl_full.py``, ``table_mapping.py``). That handle is
``QwenFCHandler``: the function docs go into the Qwen3 chat template's ``<tools>`` block
(``json.dumps`` of BFCL's own doc, with BFCL's language hints), the reply's
``<tool_call>\\n{json}\\n</tool_call>`` blocks are the calls (after the last ``</think>``),
tool results come back as ``tool`` messages, at most 20 steps per turn, and a force-quit
fails the entry (``multi_turn:force_terminated``).

Here: the data, the language hints and the held-out functions come from ``bfcl_eval.utils``
(``load_dataset_entry``), the single-turn verdicts from ``bfcl_eval``'s ``ast_checker`` and
its relevance rule (run in the checker processes: they compare parsed values and execute
nothing), the multi-turn verdicts from its ``multi_turn_checker`` inside the sandbox
(``bfcl_env``: it ``eval``s model-written call strings). What is ours: the decoding (a copy
of ``QwenFCHandler``'s, which needs ``openai``/``overrides``/``tree_sitter`` to import; the
tests hold it to the package's), the prompt rendering for a chat template without tool
support (a copy of ``QwenFCHandler._format_prompt``), and the score aggregation (a copy of
``eval_runner_helper.generate_leaderboard_csv``'s arithmetic; that module needs pandas).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import types
from typing import Any

__all__ = ["MODEL", "MAX_STEPS", "NON_LIVE", "LIVE", "MULTI_TURN", "ALL", "ADDITIONAL",
           "split_reasoning", "extract_tool_calls", "decode_ast", "decode_execute",
           "is_empty_execute", "qwen_fc_format", "load_category", "category_sizes", "single_turn_verdict",
           "aggregate"]  # fmt: skip

MODEL = "Qwen/Qwen3-4B-Instruct-2507-FC"  # the reference's handle (underscore_to_dot False)
MAX_STEPS = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
NON_LIVE = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
            "parallel_multiple", "irrelevance")  # fmt: skip
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
        "live_irrelevance", "live_relevance")  # fmt: skip
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
              "multi_turn_long_context")  # fmt: skip
ALL = NON_LIVE + LIVE + MULTI_TURN  # the reference's --test-category non_live,live,multi_turn
# DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING (the prompting path QwenFCHandler takes)
ADDITIONAL = "{functions}\nI have updated some more functions you can choose from. What about now?"
_TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


def _project_root() -> None:
    """bfcl_eval's ``eval_config`` makes result/score folders under BFCL_PROJECT_ROOT at
    import (by default inside site-packages): point it at a scratch folder first."""
    if "BFCL_PROJECT_ROOT" not in os.environ:
        os.environ["BFCL_PROJECT_ROOT"] = os.path.join(tempfile.gettempdir(), "spade-bfcl")


# --- decoding (QwenFCHandler) -------------------------------------------------------------


def split_reasoning(reply: str) -> tuple[str, str]:
    """``(answer, reasoning)``: QwenFCHandler keeps what follows the last ``</think>``."""
    if "</think>" in reply:
        parts = reply.split("</think>")
        return parts[-1].lstrip("\n"), parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reply, ""


def extract_tool_calls(text: str) -> list:
    """Every ``<tool_call>\\n...\\n</tool_call>`` body that parses as JSON (others dropped)."""
    out = []
    for body in _TOOL_CALL.findall(text):
        try:
            out.append(json.loads(body))
        except ValueError:
            pass
    return out


def decode_ast(text: str) -> list[dict]:
    """QwenFCHandler.decode_ast: ``[{name: {arg: value}}]``; raises on a malformed call."""
    calls = extract_tool_calls(text)
    if any(type(c) is not dict for c in calls):
        raise ValueError(f"Model did not return a list of function calls: {text}")
    return [{c["name"]: {k: v for k, v in c["arguments"].items()}} for c in calls]


def decode_execute(text: str) -> list[str]:
    """QwenFCHandler.decode_execute: call strings ``name(k=repr(v),...)`` (what BFCL eval()s)."""
    calls = extract_tool_calls(text)
    if any(type(c) is not dict for c in calls):
        raise ValueError(f"Model did not return a list of function calls: {text}")
    out = []
    for call in calls:  # convert_to_function_call
        for name, value in {call["name"]: call["arguments"]}.items():
            if type(value) is str:
                value = json.loads(value)
            out.append(f"{name}({','.join(f'{k}={v!r}' for k, v in value.items())})")
    return out


def is_empty_execute(decoded: list) -> bool:
    """multi_turn_utils.is_empty_execute_response."""
    return len(decoded) == 0 or (len(decoded) == 1 and len(decoded[0]) == 0)


# --- prompt (QwenFCHandler._format_prompt, for templates that ignore ``tools``) ----------


def qwen_fc_format(messages: list[dict], functions: list[dict]) -> str:
    """The prompt BFCL's QwenFCHandler sends (its hand-written Qwen3 chat template)."""
    out = ""
    if functions:
        out += "<|im_start|>system\n"
        if messages and messages[0]["role"] == "system":
            out += messages[0]["content"] + "\n\n"
        out += (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        )
        for tool in functions:
            out += f"\n{json.dumps(tool)}"
        out += (
            "\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        )
    elif messages and messages[0]["role"] == "system":
        out += f"<|im_start|>system\n{messages[0]['content']}<|im_end|>\n"
    last_query = len(messages) - 1
    for idx in range(len(messages) - 1, -1, -1):
        m = messages[idx]
        c = m["content"]
        if (
            m["role"] == "user"
            and type(c) is str
            and not (c.startswith("<tool_response>") and c.endswith("</tool_response>"))
        ):
            last_query = idx
            break
    for idx, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if role == "user" or (role == "system" and idx != 0):
            out += f"<|im_start|>{role}\n{content}<|im_end|>\n"
        elif role == "assistant":
            reasoning = ""
            if m.get("reasoning_content"):
                reasoning = m["reasoning_content"]
            elif "</think>" in content:
                parts = content.split("</think>")
                reasoning = parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                content = parts[-1].lstrip("\n")
            if idx > last_query and (idx == len(messages) - 1 or reasoning):
                out += (
                    f"<|im_start|>{role}\n<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
                    + content.lstrip("\n")
                )  # fmt: skip
            else:
                out += f"<|im_start|>{role}\n{content}"
            for i, call in enumerate(m.get("tool_calls") or []):
                if (i == 0 and content) or i != 0:
                    out += "\n"
                call = call.get("function", call)
                args = call["arguments"]
                out += '<tool_call>\n{"name": "' + call["name"] + '", "arguments": '
                out += args if isinstance(args, str) else json.dumps(args)
                out += "}\n</tool_call>"
            out += "<|im_end|>\n"
        elif role == "tool":
            prev = messages[idx - 1]["role"] if idx > 0 else None
            nxt = messages[idx + 1]["role"] if idx < len(messages) - 1 else None
            if idx == 0 or prev != "tool":
                out += "<|im_start|>user"
            out += f"\n<tool_response>\n{content}\n</tool_response>"
            if idx == len(messages) - 1 or nxt != "tool":
                out += "<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


# --- data ----------------------------------------------------------------------------------


def load_category(category: str) -> list[dict]:
    """BFCL's entries for ``category`` as its generation sees them (language hints, held-out
    functions moved to ``missed_function``), each with ``plain_function`` (the docs its
    evaluation hands the AST checker: no hints) and ``ground_truth`` where there is one."""
    _project_root()
    from bfcl_eval.utils import (
        is_relevance_or_irrelevance,
        load_dataset_entry,
        load_ground_truth_entry,
    )

    entries = load_dataset_entry(category, include_prereq=False)
    plain = load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    answers = None if is_relevance_or_irrelevance(category) else load_ground_truth_entry(category)
    for i, entry in enumerate(entries):
        if plain[i]["id"] != entry["id"]:
            raise ValueError(f"bfcl-eval data out of order: {plain[i]['id']} vs {entry['id']}")
        entry["plain_function"] = plain[i].get("function", [])
        if answers is not None:  # aligned by index, as eval_runner aligns them
            entry["ground_truth"] = answers[i]["ground_truth"]
    return entries


def category_sizes() -> dict[str, int]:
    """Entries per category (lines of the package's data files): what a category not
    evaluated weighs in BFCL's sections."""
    import importlib.resources

    root = importlib.resources.files("bfcl_eval") / "data"
    return {c: sum(1 for line in (root / f"BFCL_v4_{c}.json").read_text().splitlines() if line.strip())
            for c in ALL}  # fmt: skip


# --- single-turn verdict (runs in a checker process) ---------------------------------------


def _ast_checker():
    """bfcl_eval's ast_checker. Its module imports ``constants.model_config`` (every
    vendor SDK) for one field, ``underscore_to_dot``: a stand-in module holding only the
    reference's handle answers that (False for it; any other name is a KeyError, as the
    real mapping gives for an unknown model)."""
    _project_root()
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)
        stub.MODEL_CONFIG_MAPPING = {MODEL: types.SimpleNamespace(underscore_to_dot=False)}
        sys.modules[name] = stub
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker


def single_turn_verdict(category: str, functions: list, ground_truth: Any, reply: str) -> dict:
    """eval_runner's ``_evaluate_single_relevance_entry`` / ``_evaluate_single_ast_entry``
    for one reply (after QwenFCHandler's reasoning split): ``{"valid", "error_type",
    "decoded"}``."""
    _project_root()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.utils import (
        is_empty_output,
        is_function_calling_format_output,
        is_java,
        is_js,
        is_relevance_or_irrelevance,
    )

    text, _ = split_reasoning(reply)
    if is_relevance_or_irrelevance(category):
        try:
            decoded = decode_ast(text)
            has_call = not is_empty_output(decoded)
        except Exception:  # noqa: BLE001 - BFCL: a decode failure is "no call"
            decoded, has_call = None, False
        valid = (not has_call) if "irrelevance" in category else has_call
        err = None if valid else ("irrelevance_error:decoder_success" if "irrelevance" in category
                                  else "relevance_error:decoder_failed")  # fmt: skip
        return {"valid": valid, "error_type": err, "decoded": repr(decoded)}
    try:
        decoded = decode_ast(text)
    except Exception:  # noqa: BLE001
        return {"valid": False, "error_type": "ast_decoder:decoder_failed", "decoded": None}
    if not is_function_calling_format_output(decoded):
        return {"valid": False, "error_type": "ast_decoder:decoder_wrong_output_format",
                "decoded": repr(decoded)}  # fmt: skip
    language = (Language.JAVA if is_java(category) else Language.JAVASCRIPT if is_js(category)
                else Language.PYTHON)  # fmt: skip
    try:
        res = _ast_checker()(functions, decoded, ground_truth, language, category, MODEL)
    except Exception as exc:  # noqa: BLE001 - the checker on odd values: a wrong answer
        return {"valid": False, "error_type": f"ast_checker:{type(exc).__name__}",
                "decoded": repr(decoded)}  # fmt: skip
    return {"valid": bool(res["valid"]), "error_type": res.get("error_type"),
            "decoded": repr(decoded)}  # fmt: skip


# --- aggregation (eval_runner_helper.generate_leaderboard_csv) ------------------------------


def _unweighted(parts: list[tuple[float, int]]) -> tuple[float, int]:
    return sum(a for a, _ in parts) / len(parts), sum(n for _, n in parts)


def _weighted(parts: list[tuple[float, int]]) -> tuple[float, int]:
    total = sum(n for _, n in parts)
    return (sum(a * n for a, n in parts) / total if total else 0.0), total


def aggregate(acc: dict[str, float], count: dict[str, int], sizes: dict[str, int]) -> dict:
    """BFCL's section and overall accuracies from per-category ``acc`` (over ``count``
    evaluated entries). A category not evaluated counts as accuracy 0 over its full size
    (``sizes``), as ``get_category_score`` does; agentic (memory, web_search), which the
    reference does not run, is such a 0 at weight 40 of 100."""

    def cat(name: str) -> tuple[float, int]:
        return (acc[name], count[name]) if name in acc else (0.0, sizes.get(name, 0))

    simple = _unweighted([cat("simple_python"), cat("simple_java"), cat("simple_javascript")])
    non_live = _unweighted([simple, cat("multiple"), cat("parallel"), cat("parallel_multiple")])
    live = _weighted([cat("live_simple"), cat("live_multiple"), cat("live_parallel"),
                      cat("live_parallel_multiple")])  # fmt: skip
    irrelevance = _unweighted([cat("irrelevance"), cat("live_irrelevance")])
    multi_turn = _unweighted([cat(c) for c in MULTI_TURN])
    agentic = (0.0, 0)
    parts, weights = [non_live, live, irrelevance, multi_turn, agentic], [10, 10, 10, 30, 40]
    overall = sum(a * w for (a, _), w in zip(parts, weights, strict=True)) / sum(weights)
    return {"overall": overall, "non_live": non_live[0], "live": live[0],
            "irrelevance": irrelevance[0], "multi_turn": multi_turn[0],
            "relevance": cat("live_relevance")[0], "simple": simple[0]}  # fmt: skip
