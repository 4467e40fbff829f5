"""reasoning-gym (offline, PyPI ``reasoning-gym``) in the reference's four buckets.

The reference evaluates the 100 tasks of the RG paper's App. A.3 split, 8 episodes per task
(seed 42, reset seeds 0-7), temperature 0.6, top_p 0.8, top_k 20, 8,192 tokens, and pools
wins (reward >= 1.0) per bucket: Math 31, Algorithmic 36, Cognition 24, Logic 9 tasks. Its
"hard" parameters live in a file the reference does not publish here, so this suite uses
reasoning-gym's default task configs (noted in every result). A task whose generator fails
on this machine is skipped and named in the result's notes.

Scoring is reasoning-gym's own ``score_answer`` on the last ``<answer>`` (``\\boxed{}`` as
fallback), run in a checker process with a timeout (``spade_async.eval.checker``).
"""

from __future__ import annotations

import importlib.util
import json

from spade_async.errors import SpadeError
from spade_async.eval.checker import CheckTimeout, rg_score
from spade_async.eval.extract import last_answer_tag
from spade_async.eval.suites.base import Context, Suite
from spade_async.eval.types import Item, Sampling

__all__ = ["BUCKETS", "ReasoningGym"]

BUCKETS: dict[str, list[str]] = {
    "math": """complex_arithmetic intermediate_integration polynomial_equations
        polynomial_multiplication simple_equations simple_integration basic_arithmetic
        bitwise_arithmetic calendar_arithmetic chain_sum count_bits decimal_arithmetic
        decimal_chain_sum dice fraction_simplification gcd gsm_symbolic lcm leg_counting
        number_format power_function prime_factorization products time_intervals
        advanced_geometry simple_geometry course_schedule family_relationships largest_island
        quantum_lock shortest_path""".split(),
    "algorithmic": """ab base_conversion binary_alternation binary_matrix caesar_cipher
        count_primes cryptarithm game_of_life game_of_life_halting graph_color group_anagrams
        isomorphic_strings jugs letter_counting letter_jumble manipulate_matrix number_filtering
        number_sorting palindrome_generation palindrome_partitioning pool_matrix ransom_note
        rotate_matrix rotten_oranges sentence_reordering spell_backward spiral_matrix
        string_insertion string_manipulation string_splitting string_synthesis word_ladder
        word_sequence_reversal word_sorting bf codeio""".split(),
    "cognition": """arc_1d arc_agi rearc color_cube_rotation figlet_font modulo_grid
        needle_haystack number_sequence rectangle_count rubiks_cube countdown emoji_mystery
        futoshiki knight_swap mahjong_puzzle maze mini_sudoku n_queens puzzle24 rush_hour
        sokoban sudoku tower_of_hanoi tsumego""".split(),
    "logic": """acre list_functions aiw circuit_logic knights_knaves propositional_logic
        self_reference syllogism zebra_puzzles""".split(),
}
EPISODES = 8
SEED = 42


def _gold(entry: dict) -> str:
    """The reference answer; tasks with many right answers carry one as ``example_answer``."""
    if entry.get("answer") is not None:
        return str(entry["answer"])
    meta = entry.get("metadata", {})
    for key in ("example_answer", "example_correct_answer", "possible_answer"):
        if key in meta:
            value = meta[key]
            return json.dumps(value) if isinstance(value, dict) else str(value)
    return ""  # rush_hour: no reference solution ships with the entry


class ReasoningGym(Suite):
    sampling = Sampling(n=1, temperature=0.6, top_p=0.8, top_k=20, max_tokens=8192)
    majority = False  # free-form answers: equal strings are not the only right ones

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.name = f"rg_{bucket}"
        self.notes: list[str] = ["reasoning-gym default task configs (not the A.3 hard split)"]

    def load(self, limit: int) -> list[Item]:
        if importlib.util.find_spec("reasoning_gym") is None:
            raise SpadeError(
                f"suite {self.name} needs reasoning-gym: pip install 'spade-async[eval]' "
                "(or make install)"
            )
        from spade_async.eval.suites.rg_gen import generate

        rows, notes, system = generate(BUCKETS[self.bucket], EPISODES, SEED, limit)
        self.notes += notes
        return [
            Item(
                id=f"{r['task']}/{r['index']}",
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": r["entry"]["question"]}],
                answer=_gold(r["entry"]), meta={"task": r["task"], "entry": r["entry"]},
            )
            for r in rows
        ]  # fmt: skip

    async def score(self, item: Item, completion: str, ctx: Context) -> tuple[str | None, float]:
        answer = last_answer_tag(completion)
        if answer is None:
            return None, 0.0
        try:
            reward = await ctx.checker.call(
                rg_score, item.meta["task"], SEED, EPISODES, item.meta["entry"], answer
            )
        except CheckTimeout:
            reward = 0.0
        return answer, 1.0 if reward >= 1.0 else 0.0
