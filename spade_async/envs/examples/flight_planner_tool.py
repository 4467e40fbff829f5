"""Flight planner: pick the cheapest flight that meets a deadline and has enough seats.

Skill: Optimization. Setting: tool_use.

A simulated airline backend. The agent searches the flights on a route, filters them by
arrival time, checks seat availability (a separate, per-flight tool) and answers with the
flight number of the cheapest flight that satisfies every constraint. The cheapest flight
overall usually fails one constraint, so the answer needs several lookups.

Written in the reference style: ToolUseBaseEnv is not imported; the sandbox injects it.
"""

import random

CITIES = ["Lisbon", "Oslo", "Vienna", "Dublin", "Athens", "Prague", "Zurich", "Warsaw"]


class FlightPlannerEnv(ToolUseBaseEnv):  # noqa: F821 - injected by the sandbox
    max_answer_attempts = 1

    def __init__(self, max_turns=12, **kwargs):
        super().__init__(max_turns=max_turns, **kwargs)

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.origin, self.destination = rng.sample(CITIES, 2)
            self.deadline, self.party = rng.randint(12, 17), rng.randint(2, 4)
            flights = {}
            for _ in range(rng.randint(5, 7)):
                number = f"{rng.choice(['TP', 'SK', 'OS', 'EI'])}{rng.randint(100, 999)}"
                depart = rng.randint(6 * 60, 16 * 60) // 15 * 15
                flights[number] = {"depart": depart, "arrive": depart + rng.randint(100, 260),
                                   "price": rng.randint(60, 400), "seats": rng.randint(0, 6)}
            ok = [n for n, f in flights.items()
                  if f["arrive"] <= self.deadline * 60 and f["seats"] >= self.party]
            cheapest = min(flights, key=lambda n: flights[n]["price"])
            if ok and cheapest not in ok and len({flights[n]["price"] for n in ok}) == len(ok):
                break
        self._state = {"flights": flights}
        self._expected_answer = min(ok, key=lambda n: flights[n]["price"])
        self._tools = {
            "search_flights": {
                "description": "List flights on a route with departure, arrival and price.",
                "parameters": {"type": "object",
                               "properties": {"origin": {"type": "string"},
                                              "destination": {"type": "string"}},
                               "required": ["origin", "destination"]},
            },
            "get_seats": {
                "description": "Number of seats still free on one flight.",
                "parameters": {"type": "object", "properties": {"flight": {"type": "string"}},
                               "required": ["flight"]},
            },
        }
        obs = (f"Book {self.party} people from {self.origin} to {self.destination} tomorrow. "
               f"They must land by {self.deadline}:00 and all sit on the same flight. Find the "
               "cheapest flight that works and reply <answer>FLIGHT_NUMBER</answer>.")
        return obs, {}

    @staticmethod
    def _clock(minutes):
        return f"{minutes // 60:02d}:{minutes % 60:02d}"

    def tool_search_flights(self, origin, destination):
        route = (str(origin).strip().lower(), str(destination).strip().lower())
        if route != (self.origin.lower(), self.destination.lower()):
            return f"No flights from {origin} to {destination} tomorrow."
        rows = [f"{n}: departs {self._clock(f['depart'])}, arrives {self._clock(f['arrive'])}, "
                f"${f['price']}" for n, f in self._state["flights"].items()]
        return "\n".join(rows)

    def tool_get_seats(self, flight):
        info = self._state["flights"].get(str(flight).strip().upper())
        if info is None:
            return f"Unknown flight {flight!r}."
        return f"{str(flight).upper()}: {info['seats']} seats free"

    def solution(self):
        flights = self._state["flights"]
        in_time = [n for n, f in flights.items() if f["arrive"] <= self.deadline * 60]
        steps = [self.tool_call_action("search_flights", origin=self.origin,
                                       destination=self.destination)]
        steps += [self.tool_call_action("get_seats", flight=n)
                  for n in sorted(in_time, key=lambda n: flights[n]["price"])
                  if flights[n]["price"] <= flights[self._expected_answer]["price"]]
        return steps + [self.answer_action(self._expected_answer)]
