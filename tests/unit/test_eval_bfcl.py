"""BFCL-v4: hand-made replies, each scored by our suite and by bfcl-eval's own evaluation
code (``eval_runner``'s per-entry verdicts through the reference's QwenFCHandler, its
leaderboard arithmetic), with the verdict a careful reader gives beside them."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import anyio
import pytest

from spade_async.eval.suites import bfcl_lib as lib
from spade_async.eval.suites import make_suite

sys.path.insert(0, str(Path(__file__).parent))
import bfcl_reference  # noqa: E402

REF = bfcl_reference.load()


def call(name: str, **args) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


@pytest.fixture(scope="module")
def entries() -> dict[str, dict]:
    out = {}
    for cat in ("simple_python", "multiple", "parallel", "irrelevance", "live_relevance",
                "live_simple", "simple_java", "simple_javascript"):  # fmt: skip
        for e in lib.load_category(cat):
            out[e["id"]] = e | {"category": cat}
    return out


THINK_WRONG = (
    "<think>\nMaybe " + call("calculate_triangle_area", base=1, height=1) + "\nno.\n</think>\n\n"
)
# (entry id, reply, what a careful reader says)
SINGLE = [
    ("simple_python_0", call("calculate_triangle_area", base=10, height=5), True),
    ("simple_python_0", call("calculate_triangle_area", base=10, height=5, unit="units"), True),
    ("simple_python_0", THINK_WRONG + call("calculate_triangle_area", base=10, height=5), True),
    (
        "simple_python_0",
        "<think>I will answer</think>" + call("calculate_triangle_area", base=10, height=5),
        True,
    ),
    ("simple_python_0", call("calculate_triangle_area", base=10, height=6), False),
    ("simple_python_0", call("calculate_triangle_area", base=10), False),  # required missing
    ("simple_python_0", call("calculate_triangle_area", base="10", height=5), False),  # a string
    ("simple_python_0", call("calculate_triangle_area", base=10, height=5, color="red"), False),
    ("simple_python_0", call("triangle_area", base=10, height=5), False),  # wrong name
    ("simple_python_0", call("calculate_triangle_area", base=10, height=5) * 2, False),  # twice
    ("simple_python_0", "The area is 25.", False),  # no call
    (
        "simple_python_0",
        '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"base": 10,',
        False,
    ),
    ("multiple_0", call("triangle_properties.get", side1=5, side2=4, side3=3), True),
    ("multiple_0", call("triangle_properties.get", side1=5, side2=4, side3=3, get_area=True), True),
    ("multiple_0", call("triangle_properties.get", side1=3, side2=4, side3=5), False),
    (
        "parallel_0",
        call("spotify.play", artist="Taylor Swift", duration=20)
        + "\n"
        + call("spotify.play", artist="Maroon 5", duration=15),
        True,
    ),
    (
        "parallel_0",
        call("spotify.play", artist="Maroon 5", duration=15)
        + "\n"
        + call("spotify.play", artist="Taylor Swift", duration=20),
        True,
    ),  # any order
    ("parallel_0", call("spotify.play", artist="Taylor Swift", duration=20), False),  # one of two
    (
        "irrelevance_0",
        "None of the tools computes a triangle's area: it is 25 square meters.",
        True,
    ),
    ("irrelevance_0", call("determine_body_mass_index", weight=10.0, height=5.0), False),
    (
        "irrelevance_0",
        "<think>"
        + call("determine_body_mass_index", weight=1.0, height=1.0)
        + "</think>I cannot do this with the tools given.",
        True,
    ),  # a call only in the thinking
    ("live_relevance_0-0-0", "I can't.", False),
    (
        "simple_java_0",
        call(
            "GeometryPresentation.createPresentation", controller="mapController", parent="mapArea"
        ),
        True,
    ),  # fmt: skip
    (
        "simple_javascript_0",
        call("validateUserInput", inputField="userInputField", isComplete="true"),
        True,
    ),  # JS values in string form
    (
        "simple_javascript_0",
        call("validateUserInput", inputField="userInputField", isComplete="false"),
        False,
    ),  # fmt: skip
]


def _reference_verdict(e: dict, reply: str) -> bool:
    """eval_runner on the handler's parsed response (what BFCL's result file holds)."""
    api = types.SimpleNamespace(
        choices=[types.SimpleNamespace(text=reply)],
        usage=types.SimpleNamespace(prompt_tokens=0, completion_tokens=0),
    )
    model_result = REF.handler._parse_query_response_prompting(api)["model_responses"]
    prompt = {"id": e["id"], "question": e["question"], "function": e["plain_function"]}
    cat = e["category"]
    if "relevance" in cat:
        out = REF.runner._evaluate_single_relevance_entry(
            REF.handler, e["id"], model_result, prompt, bfcl_reference.MODEL, cat
        )
    else:
        from bfcl_eval.constants.enums import Language, ReturnFormat

        lang = {"simple_java": "JAVA", "simple_javascript": "JAVASCRIPT"}.get(cat, "PYTHON")
        out = REF.runner._evaluate_single_ast_entry(
            REF.handler, e["id"], model_result, e["ground_truth"], prompt, bfcl_reference.MODEL,
            cat, language=Language[lang], return_format=ReturnFormat[lang],
        )  # fmt: skip
    return bool(out["valid"])


@pytest.mark.parametrize(("entry_id", "reply", "human"), SINGLE)
def test_single_turn_verdicts_equal_bfcl_eval_and_a_careful_reader(entries, entry_id, reply, human):
    e = entries[entry_id]
    ours = lib.single_turn_verdict(e["category"], e["plain_function"], e.get("ground_truth"), reply)
    assert _reference_verdict(e, reply) == human, (entry_id, reply)
    assert ours["valid"] == human, (entry_id, reply, ours)


def test_enough_hand_made_single_turn_replies():
    assert len(SINGLE) >= 20
    assert {h for *_, h in SINGLE} == {True, False}


def test_decoding_equals_the_qwen_fc_handler():
    replies = [r for _, r, _ in SINGLE] + ['<tool_call>\n{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}\n</tool_call>',
                                           '<tool_call>\n["not", "a", "dict"]\n</tool_call>']  # fmt: skip
    for reply in replies:
        text, _ = lib.split_reasoning(reply)
        for ours, theirs in ((lib.decode_ast, lambda t: REF.handler.decode_ast(t, "python", False)),
                             (lib.decode_execute, lambda t: REF.handler.decode_execute(t, False))):  # fmt: skip
            try:
                want = theirs(text)
            except Exception as exc:  # noqa: BLE001
                with pytest.raises(type(exc)):
                    ours(text)
                continue
            assert ours(text) == want, reply


def test_prompt_equals_the_qwen_fc_handler(entries):
    """The fallback prompt (templates without tool support) is BFCL's Qwen formatting."""
    e = entries["multiple_0"]
    history = [{"role": "system", "content": "Be brief."}, *e["question"][0],
               {"role": "assistant", "content": "", "reasoning_content": "",
                "tool_calls": [{"name": "triangle_properties.get", "arguments": {"side1": 5}}]},
               {"role": "tool", "name": "x", "content": "area 6"},
               {"role": "tool", "name": "y", "content": "perimeter 12"},
               {"role": "assistant", "content": "<think>ok</think>Done."}]  # fmt: skip
    for msgs in (e["question"][0], history):
        assert lib.qwen_fc_format(msgs, e["function"]) == REF.handler._format_prompt(
            msgs, e["function"]
        )
    assert lib.qwen_fc_format(history, []) == REF.handler._format_prompt(history, [])


def test_native_qwen3_template_gives_the_handler_prompt(entries, monkeypatch):
    """A Qwen3 tokenizer (its chat template: the handler's docstring) renders BFCL's tools to
    the same prompt the handler sends: the engine path of the suite."""
    import inspect

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from spade_async.eval.engine import ClientGenerator
    from spade_async.generation import chat

    source = Path(inspect.getsourcefile(type(REF.handler))).read_text()  # the docstring unescaped
    template = source.split('"chat_template":', 1)[1].split('"""', 1)[0].strip()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, "[UNK]"))
    )
    tok.chat_template = template
    e = entries["simple_python_0"]
    gen = ClientGenerator(None, tok)
    seen = []
    real = chat._encode  # the text a prompt is encoded from (chat.render_prompt's one path)

    def spy(tokenizer, text):
        seen.append(text)
        return real(tokenizer, text)

    monkeypatch.setattr(chat, "_encode", spy)
    ids = gen._with_tools(e["question"][0], e["function"])
    assert seen == [REF.handler._format_prompt(e["question"][0], e["function"])]
    assert ids == list(tok(seen[0], add_special_tokens=False).input_ids)


def test_overall_equals_bfcl_leaderboard_arithmetic(tmp_path):
    """Per-category accuracies (some categories missing) -> our sections and overall vs
    ``generate_leaderboard_csv``'s data_overall.csv (BFCL prints percentages to 2 places)."""
    import csv

    acc = {c: ((i * 7) % 11) / 10 for i, c in enumerate(lib.ALL)}
    del acc["simple_java"], acc["live_parallel"]  # not evaluated: 0 over the full size
    sizes = {c: len(lib.load_category(c)) for c in ("simple_java", "live_parallel")}
    count = {c: 3 + i for i, c in enumerate(acc)}  # entries evaluated (the live weights)
    name = bfcl_reference.MODEL.replace("/", "_")
    table = {name: {c: {"accuracy": a, "total_count": count[c]} for c, a in acc.items()}}
    REF.helper.generate_leaderboard_csv(table, tmp_path)

    def row(name: str) -> dict:
        return next(csv.DictReader((tmp_path / name).read_text().splitlines()))

    ours = lib.aggregate(acc, count, sizes)
    for metric, file, column in (("overall", "data_overall.csv", "Overall Acc"),
                                 ("non_live", "data_non_live.csv", "Non-Live Overall Acc"),
                                 ("live", "data_live.csv", "Live Overall Acc"),
                                 ("multi_turn", "data_multi_turn.csv", "Multi Turn Overall Acc"),
                                 ("irrelevance", "data_overall.csv", "Irrelevance Detection")):  # fmt: skip
        assert f"{ours[metric] * 100:.2f}%" == row(file)[column], (metric, row(file)[column])
    assert 0.0 < ours["overall"] <= 0.6  # agentic (weight 40) is not run: at most 60%


# --- multi-turn: dialogues through the suite (sandbox) vs eval_runner in this process ----


class Script:
    """Replies per (turn, step) for one entry; after a turn's list: a plain reply."""

    def __init__(self, turns: list[list[str]]) -> None:
        self.turns = turns

    async def __call__(self, messages, sampling, *, item=None, tools=None) -> str:
        assert tools, "BFCL passes the function docs as tools"
        turn = sum(1 for m in messages if m["role"] == "user") - 1
        step = 0
        for m in reversed(messages):
            if m["role"] == "user":
                break
            step += m["role"] == "assistant"
        script = self.turns[turn] if turn < len(self.turns) else []
        return script[step] if step < len(script) else "All done."


GOLD_0 = [
    [call("cd", folder="document") + "\n" + call("mkdir", dir_name="temp"),
     call("mv", source="final_report.pdf", destination="temp")],
    [call("cd", folder="temp"), call("grep", file_name="final_report.pdf", pattern="budget analysis")],
    [call("sort", file_name="final_report.pdf")],
    [call("cd", folder=".."), call("mv", source="previous_report.pdf", destination="temp"),
     call("cd", folder="temp"),
     call("diff", file_name1="final_report.pdf", file_name2="previous_report.pdf")],
]  # fmt: skip
DIALOGUES = [  # (name, replies per turn, human verdict, BFCL error type when failed)
    ("gold", GOLD_0, True, None),
    ("gold with thinking", [["<think>first cd</think>\n" + r for r in t] for t in GOLD_0], True, None),
    ("wrong folder", [[call("mkdir", dir_name="tmp")], *GOLD_0[1:]], False, "multi_turn:instance_state_mismatch"),
    ("says it did it", [["Moved it for you."], *GOLD_0[1:]], False, "multi_turn:empty_turn_model_response"),
    ("21 steps", [[call("pwd")] * 21, *GOLD_0[1:]], False, "multi_turn:force_terminated"),
    ("call inside thinking only", [["<think>" + call("mkdir", dir_name="temp") + "</think>Done."],
                                   *GOLD_0[1:]], False, "multi_turn:empty_turn_model_response"),
]  # fmt: skip


def _bfcl_loop(questions: int, turns: list[list[str]]) -> tuple[list[list[str]], bool]:
    """BFCL's inference loop (base_handler.inference_multi_turn_prompting) on the script:
    every step's parsed response, until one decodes to no call or the 21st executed step."""
    model_result = []
    for t in range(questions):
        script = turns[t] if t < len(turns) else []
        replies, count, step = [], 0, 0
        while True:
            raw = script[step] if step < len(script) else "All done."
            step += 1
            api = types.SimpleNamespace(choices=[types.SimpleNamespace(text=raw)],
                                        usage=types.SimpleNamespace(prompt_tokens=0, completion_tokens=0))  # fmt: skip
            text = REF.handler._parse_query_response_prompting(api)["model_responses"]
            replies.append(text)
            try:
                decoded = REF.handler.decode_execute(text, False)
            except Exception:  # noqa: BLE001
                break
            if not decoded or (len(decoded) == 1 and not decoded[0]):
                break
            count += 1
            if count > 20:  # MAXIMUM_STEP_LIMIT
                model_result.append(replies)
                return model_result, True
        model_result.append(replies)
    return model_result, False


@pytest.fixture(scope="module")
def played() -> dict:
    """Every dialogue through the suite, concurrently, in one sandbox pool (as evaluate does)."""
    import contextlib

    from spade_async.eval.runner import open_episode_pools
    from spade_async.eval.suites import Context

    suite = make_suite("bfcl_v4_multi_turn")
    item = next(i for i in suite.load(0) if i.id == "multi_turn_base_0")
    out = {}

    async def one(ctx_pools, name, turns):
        ctx = Context(Script(turns), None, None, None, episode_pools=ctx_pools)
        out[name] = await suite.play(item, 0, suite.sampling, ctx)

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            pools = await open_episode_pools([suite], stack)
            async with anyio.create_task_group() as tg:
                for name, turns, *_ in DIALOGUES:
                    tg.start_soon(one, pools, name, turns)

    anyio.run(main)
    return {"item": item, "samples": out}


@pytest.mark.parametrize(
    ("name", "turns", "human", "error"), DIALOGUES, ids=[d[0] for d in DIALOGUES]
)
def test_multi_turn_dialogues_equal_bfcl_eval(played, name, turns, human, error):
    item, sample = played["item"], played["samples"][name]
    model_result, forced = _bfcl_loop(len(item.meta["question"]), turns)
    entry = {"id": item.id, "initial_config": item.meta["initial_config"],
             "involved_classes": item.meta["involved_classes"], "question": item.meta["question"]}  # fmt: skip
    ref = REF.runner._evaluate_single_multi_turn_entry(
        REF.handler, item.id, model_result, item.meta["ground_truth"], entry,
        bfcl_reference.MODEL, "multi_turn_base",
    )  # fmt: skip
    assert ref["valid"] == human, ref.get("error")
    assert forced == (error == "multi_turn:force_terminated")
    assert json.loads(sample.extracted) == model_result  # the same replies, turn by turn
    assert sample.score == (1.0 if human else 0.0), (name, sample.error)
    if not human:
        assert ref["error"]["error_type"] == error
        assert sample.error == error


def test_hostile_calls_run_only_in_the_sandbox(tmp_path):
    """A call "name" that is code (bfcl-eval eval()s call strings): it runs in the episode's
    sandbox worker, never here; a shell is refused there, an exit ends only that worker."""
    import contextlib

    from spade_async.eval.runner import open_episode_pools
    from spade_async.eval.suites import Context

    marker = tmp_path / "pwned"
    suite = make_suite("bfcl_v4_multi_turn")
    item = next(i for i in suite.load(0) if i.id == "multi_turn_base_0")
    hostile = {
        "system": f"__import__('os').system('touch {marker}') or ls",
        "exit": "__import__('os')._exit(3) or ls",
    }
    out = {}

    async def main():
        async with contextlib.AsyncExitStack() as stack:
            pools = await open_episode_pools([suite], stack)
            for name, fn in hostile.items():
                ctx = Context(
                    Script([[call(fn)], *GOLD_0[1:]]), None, None, None, episode_pools=pools
                )
                out[name] = await suite.play(item, 0, suite.sampling, ctx)

    anyio.run(main)
    assert not marker.exists()
    assert all(s.score == 0.0 for s in out.values()), {k: s.error for k, s in out.items()}
    assert out["exit"].error.startswith("sandbox:"), out["exit"].error
