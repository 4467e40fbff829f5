"""Peak finder: locate the maximum of a hidden unimodal function with few probes.

Skill: Optimization. Setting: games.

A hidden yield curve over settings 1..60 rises strictly to a single peak and then falls
strictly (different slopes on each side). Each probe reveals the yield at one setting and
only twelve probes are allowed, so the agent must search cleverly (compare neighbours,
halve the interval, or golden-section search). Submitting the peak scores 1.0; another
setting scores up to 0.5 in proportion to its yield.

Actions: \\boxed{probe 17}   \\boxed{submit 23}
"""

import random
import re

N = 60


class PeakFinderEnv:
    def __init__(self, max_turns=16, max_probes=12, **kwargs):
        self.max_turns = max_turns
        self.max_probes = max_probes
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.peak = rng.randint(2, N - 1)
        self.left_slope, self.right_slope = rng.randint(3, 15), rng.randint(3, 15)
        self.probes = {}
        self.turn = 0
        self.done = False
        obs = (f"A machine's yield depends on a setting from 1 to {N}; it rises to one peak and "
               f"then falls. Probe a setting with \\boxed{{probe x}} ({self.max_probes} probes), "
               "then choose the best setting with \\boxed{submit x}.")
        return obs, {}

    def f(self, x):
        slope = self.left_slope if x < self.peak else self.right_slope
        return 1000 - slope * abs(x - self.peak)

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        match = re.search(r"\\boxed\{\s*(probe|submit)\s+(\d+)\s*\}", (action or "").lower())
        reward, terminated = 0.0, False
        x = int(match.group(2)) if match else 0
        if not match or not 1 <= x <= N:
            obs = f"Invalid command. Use \\boxed{{probe x}} or \\boxed{{submit x}} with 1 <= x <= {N}."
        elif match.group(1) == "probe":
            if len(self.probes) >= self.max_probes and x not in self.probes:
                obs = "No probes left: submit a setting."
            else:
                self.probes[x] = self.f(x)
                seen = ", ".join(f"{k}:{v}" for k, v in sorted(self.probes.items()))
                obs = f"yield({x}) = {self.probes[x]}. Probed so far: {seen}."
        else:
            terminated = True
            low = min(self.f(1), self.f(N))
            if x == self.peak:
                obs, reward = f"Peak found: yield {self.f(x)} at setting {x}.", 1.0
            else:
                reward = round(0.5 * (self.f(x) - low) / (1000 - low), 3)
                obs = f"Setting {x} yields {self.f(x)}; the peak was {self.peak}."
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            obs += f" Out of turns; the peak was at {self.peak}."
        self.done = terminated or truncated
        return obs, reward, terminated, truncated, {"probes": len(self.probes)}

    def solution(self):
        """Binary search on the slope (compare x and x+1): at most 12 probes, then submit."""
        lo, hi, moves, probed = 1, N, [], set()
        while lo < hi:
            mid = (lo + hi) // 2
            for x in (mid, mid + 1):
                if x not in probed:
                    probed.add(x)
                    moves.append(f"\\boxed{{probe {x}}}")
            if self.f(mid) < self.f(mid + 1):
                lo = mid + 1
            else:
                hi = mid
        return moves + [f"\\boxed{{submit {lo}}}"]
