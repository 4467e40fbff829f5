"""Order ledger: total a customer's delivered orders through a shop's lookup tools.

Skill: Mathematical_Reasoning. Setting: tool_use.

A simulated shop backend with customers, orders and order lines. The agent must find the
customer, list their orders, open each delivered one and add up quantity x unit price.
Orders that were cancelled or are still in transit do not count, so reading each status
matters. The answer is a number (tolerance 0.01).

Written in the reference style: ToolUseBaseEnv is not imported; the sandbox injects it.
"""

import random

FIRST = ["Ada", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana"]
LAST = ["Okafor", "Silva", "Lindqvist", "Moreau", "Tanaka", "Haddad", "Novak", "Reyes"]
PRODUCTS = {"SKU-101": "desk lamp", "SKU-202": "notebook", "SKU-303": "headphones",
            "SKU-404": "water bottle", "SKU-505": "backpack"}


class OrderLedgerEnv(ToolUseBaseEnv):  # noqa: F821 - injected by the sandbox
    max_answer_attempts = 1

    def reset(self, seed=None):
        rng = random.Random(seed)
        names = rng.sample([f"{f} {l}" for f in FIRST for l in LAST], 4)
        self._state = {"customers": {}, "orders": {}}
        for i, name in enumerate(names):
            cid = f"C{100 + i}"
            order_ids = []
            for _ in range(rng.randint(3, 5)):
                oid = f"O{rng.randint(1000, 9999)}"
                while oid in self._state["orders"]:
                    oid = f"O{rng.randint(1000, 9999)}"
                lines = [{"sku": sku, "qty": rng.randint(1, 3),
                          "unit_price": round(rng.uniform(3, 90), 2)}
                         for sku in rng.sample(sorted(PRODUCTS), rng.randint(1, 3))]
                status = rng.choice(["delivered", "delivered", "in_transit", "cancelled"])
                self._state["orders"][oid] = {"customer_id": cid, "status": status, "lines": lines}
                order_ids.append(oid)
            self._state["customers"][cid] = {"name": name, "orders": order_ids}
        buyers = sorted(c for c, info in self._state["customers"].items()
                        if any(self._state["orders"][o]["status"] == "delivered" for o in info["orders"]))
        if not buyers:  # rare: make sure the question has a non-zero answer
            first = self._state["customers"]["C100"]["orders"][0]
            self._state["orders"][first]["status"] = "delivered"
            buyers = ["C100"]
        self.target_id = rng.choice(buyers)
        self.target = self._state["customers"][self.target_id]["name"]
        delivered = [o for o in self._state["customers"][self.target_id]["orders"]
                     if self._state["orders"][o]["status"] == "delivered"]
        self._expected_answer = round(sum(line["qty"] * line["unit_price"]
                                          for o in delivered
                                          for line in self._state["orders"][o]["lines"]), 2)
        self._tools = {
            "find_customer": {
                "description": "Look up a customer id by full name.",
                "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                               "required": ["name"]},
            },
            "list_orders": {
                "description": "List a customer's order ids with their status.",
                "parameters": {"type": "object", "properties": {"customer_id": {"type": "string"}},
                               "required": ["customer_id"]},
            },
            "get_order": {
                "description": "Show one order's lines: sku, product, quantity, unit price.",
                "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                               "required": ["order_id"]},
            },
        }
        obs = (f"How much has {self.target} spent in total on DELIVERED orders? Cancelled and "
               "in-transit orders do not count. Use the tools, then reply <answer>amount</answer>.")
        return obs, {}

    def tool_find_customer(self, name):
        for cid, customer in self._state["customers"].items():
            if customer["name"].lower() == str(name).strip().lower():
                return f"customer_id: {cid}"
        return f"No customer named {name!r}."

    def tool_list_orders(self, customer_id):
        customer = self._state["customers"].get(str(customer_id))
        if customer is None:
            return f"No customer with id {customer_id!r}."
        return "\n".join(f"{o}: {self._state['orders'][o]['status']}" for o in customer["orders"])

    def tool_get_order(self, order_id):
        order = self._state["orders"].get(str(order_id))
        if order is None:
            return f"No order {order_id!r}."
        rows = [f"{ln['sku']} ({PRODUCTS[ln['sku']]}): qty {ln['qty']} x ${ln['unit_price']:.2f}"
                for ln in order["lines"]]
        return f"Order {order_id} [{order['status']}]\n" + "\n".join(rows)

    def solution(self):
        orders = self._state["customers"][self.target_id]["orders"]
        steps = [self.tool_call_action("find_customer", name=self.target),
                 self.tool_call_action("list_orders", customer_id=self.target_id)]
        steps += [self.tool_call_action("get_order", order_id=o) for o in orders
                  if self._state["orders"][o]["status"] == "delivered"]
        return steps + [self.answer_action(f"{self._expected_answer:.2f}")]
