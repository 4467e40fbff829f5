from spade_async.roles.prompts import designer_prompt, leaks_solution


def test_designer_prompt_has_skill_document_contract_and_memory():
    p = designer_prompt(
        skill="Optimization",
        setting="games",
        document="The knapsack problem ...",
        positives=[("class AEnv: ...", 0.5, 0.3)],
        negative=("class BEnv: ...", "too easy: win rate 0.97"),
    )
    assert "Optimization" in p and "knapsack" in p and "\\boxed{" in p
    assert "DIFFERENT" in p and "class AEnv" in p and "too easy" in p
    assert "ToolUseBaseEnv" in designer_prompt(skill="x", setting="tool_use", document=None)


def test_leak_check():
    sol = ["\\boxed{left}", "\\boxed{up}", "\\boxed{open 3}"]
    assert leaks_solution("Go left, then up, then open 3.", sol)
    assert not leaks_solution("Explore: try moving and opening things; use \\boxed{cmd}.", sol)
    assert not leaks_solution("Open doors after moving up.", sol)  # order and coverage incomplete
    assert leaks_solution("The answer is Paris.", ["<answer>Paris</answer>"], expected_answer="Paris")
    assert not leaks_solution("Call the lookup tool first.", ["<answer>Paris</answer>"], expected_answer="Paris")
