"""No class named ...Env."""


class Game:
    def reset(self, seed=None):
        return "x", {}

    def step(self, action):
        return "x", 0.0, True, False, {}
