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
    assert leaks_solution(
        "The answer is Paris.", ["<answer>Paris</answer>"], expected_answer="Paris"
    )
    assert not leaks_solution(
        "Call the lookup tool first.", ["<answer>Paris</answer>"], expected_answer="Paris"
    )


def test_designer_prompt_states_the_full_contract():
    from spade_async.roles.prompts import difficulty_steps

    p = designer_prompt(skill="Causal_Inference", setting="games", document=None, max_turns=20)
    assert "interventions" in p  # what the skill means
    assert "about 10-15 of them" in p  # medium: 1/2 to 3/4 of max_turns, as the reference
    assert "never raises" in p and "standard library only" in p  # robustness rules
    assert "Check your file before you reply" in p and "solution()" in p  # self-verification
    assert difficulty_steps("easy", 20) == (5, 10) and difficulty_steps("hard", 20) == (15, 18)
    assert difficulty_steps("unknown", 20) == (10, 15)
    seeded = designer_prompt(
        skill="x", setting="games", document=None, positives=[("class S: ...", None, None)]
    )
    assert "not played yet" in seeded and "class S" in seeded


def test_hint_prompts_per_setting_forbid_the_answer():
    from spade_async.roles.hint import HintConfig
    from spade_async.roles.prompts import hint_system

    games, tools = hint_system("games"), hint_system("tool_use")
    assert games != tools
    assert "\\boxed{command}" in games and "Never reveal the answer" in games
    assert "<tool_call>" in tools and "placeholders" in tools and "value-free" in tools
    assert HintConfig().max_new_tokens == 4096  # the reference recipes' hint budget


def test_grounded_prompt_asks_for_three_plus_steps_with_partial_rewards():
    """The corpus path (every shipped recipe) targets the reference's corpus_template.py:
    3+ interaction steps with partial rewards, not the no-corpus template's turn share."""
    grounded = designer_prompt(
        skill="Optimization", setting="games", document="Bees forage.", max_turns=25
    )
    assert "at least 3 interaction steps" in grounded and "partial progress" in grounded
    assert "of them" not in grounded  # no 12-18 of 25 turns quota
    free = designer_prompt(skill="Optimization", setting="games", document=None, max_turns=25)
    assert "about 12-18 of them" in free and "at least 3 interaction steps" not in free
