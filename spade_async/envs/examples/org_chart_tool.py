"""Org chart: follow a chain of manager links across an HR directory's tools.

Skill: Logical_Deduction. Setting: tool_use.

A simulated company directory. The question names an employee and asks in which city
their skip-level manager (the manager's manager) works. Answering requires chaining
lookups: employee -> manager -> manager -> department -> city; no single tool call shows
the answer. One answer only: guessing among the cities ends the episode.

Written in the reference style: ToolUseBaseEnv is not imported; the sandbox injects it.
"""

import random

FIRST = ["Amara", "Bilal", "Carmen", "Dmitri", "Elif", "Femi", "Greta", "Hiro", "Ines",
         "Jonas", "Kavya", "Luca", "Mei", "Nils", "Olu", "Priya"]
DEPARTMENTS = {"D1": ("Research", "Zurich"), "D2": ("Sales", "Madrid"),
               "D3": ("Platform", "Toronto"), "D4": ("Finance", "Singapore")}


class OrgChartEnv(ToolUseBaseEnv):  # noqa: F821 - injected by the sandbox
    max_answer_attempts = 1

    def reset(self, seed=None):
        rng = random.Random(seed)
        names = rng.sample(FIRST, 12)
        people = {}
        for i, name in enumerate(names):  # a tree: each person's manager comes earlier
            manager = None if i == 0 else f"E{rng.randrange(max(0, i - 4), i):02d}"
            people[f"E{i:02d}"] = {"name": name, "manager": manager,
                                   "department": rng.choice(sorted(DEPARTMENTS))}
        deep = [e for e in people if people[e]["manager"] and people[people[e]["manager"]]["manager"]]
        self.subject = rng.choice(deep)
        self.skip = people[people[self.subject]["manager"]]["manager"]
        self._state = {"people": people}
        self._expected_answer = DEPARTMENTS[people[self.skip]["department"]][1]
        self._tools = {
            "find_employee": {
                "description": "Find an employee id by first name.",
                "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                               "required": ["name"]},
            },
            "get_employee": {
                "description": "An employee's name, manager id and department id.",
                "parameters": {"type": "object", "properties": {"employee_id": {"type": "string"}},
                               "required": ["employee_id"]},
            },
            "get_department": {
                "description": "A department's name and office city.",
                "parameters": {"type": "object", "properties": {"department_id": {"type": "string"}},
                               "required": ["department_id"]},
            },
        }
        subject = people[self.subject]["name"]
        obs = (f"In which city does {subject}'s skip-level manager (the manager of {subject}'s "
               "manager) work? Use the directory tools and reply <answer>City</answer>.")
        return obs, {}

    def tool_find_employee(self, name):
        hits = [e for e, p in self._state["people"].items()
                if p["name"].lower() == str(name).strip().lower()]
        return f"employee_id: {hits[0]}" if hits else f"Nobody named {name!r}."

    def tool_get_employee(self, employee_id):
        person = self._state["people"].get(str(employee_id).strip().upper())
        if person is None:
            return f"No employee {employee_id!r}."
        return (f"{employee_id}: {person['name']}, manager_id: {person['manager'] or 'none'}, "
                f"department_id: {person['department']}")

    def tool_get_department(self, department_id):
        info = DEPARTMENTS.get(str(department_id).strip().upper())
        return f"{department_id}: {info[0]}, office in {info[1]}" if info else "Unknown department."

    def solution(self):
        people = self._state["people"]
        manager = people[self.subject]["manager"]
        return [
            self.tool_call_action("find_employee", name=people[self.subject]["name"]),
            self.tool_call_action("get_employee", employee_id=self.subject),
            self.tool_call_action("get_employee", employee_id=manager),
            self.tool_call_action("get_employee", employee_id=self.skip),
            self.tool_call_action("get_department", department_id=people[self.skip]["department"]),
            self.answer_action(self._expected_answer),
        ]
