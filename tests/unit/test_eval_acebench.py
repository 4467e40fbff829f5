"""acebench_agent on a hand-made ACEBench-shaped checkout: gold 1.0, wrong 0.0, hostile
calls and scenarios contained, multi_turn skipped without a simulator and played with a
fake OpenAI-compatible one, bad data as one line."""

import http.server
import json
import sys
import threading
from pathlib import Path

import anyio
import pytest

from spade_async.cli import main
from spade_async.envs.pool import EnvPool, PoolConfig
from spade_async.errors import SpadeError
from spade_async.eval.runner import evaluate
from spade_async.eval.suites import make_suite
from spade_async.eval.suites.acebench import SKIPPED
from spade_async.eval.suites.acebench_check import end_to_end, parse_calls, process_accuracy

sys.path.insert(0, str(Path(__file__).parent))
from eval_scripted import Scripted, gold_reply, wrong_reply  # noqa: E402

# our own invented scenario: a phone base class and a shop that imports it by package path
BASE = '''
class BaseApi:
    def __init__(self):
        self.wifi = False

    def _load_scenario(self, scenario, long_context=False):
        self.wifi = scenario.get("wifi", False)

    def turn_on_wifi(self):
        self.wifi = True
        return {"status": True, "message": "wifi is on"}
'''
SHOP = '''
from model_inference.multi_turn.scenariosen.phone.base_api import BaseApi


class Shop(BaseApi):
    def __init__(self):
        super().__init__()
        self.balance = {"Ann": 50.0, "Bob": 20.0}
        self.orders = []
        self.catalog = {"tea": 5.0, "cake": 12.0}

    def _load_scenario(self, scenario, long_context=False):
        self.wifi = scenario.get("wifi", False)
        self.balance = scenario.get("balance", self.balance)

    def price_of(self, item):
        return self.catalog.get(item, "no such item")

    def buy(self, user, item, quantity=1):
        if not self.wifi:
            return {"status": False, "message": "wifi is off"}
        cost = self.catalog[item] * quantity
        if cost > self.balance[user]:
            return {"status": False, "message": "insufficient balance"}
        self.balance[user] -= cost
        self.orders.append({"user": user, "item": item, "quantity": quantity})
        return {"status": True, "message": f"paid {cost}"}
'''
HOSTILE_METHODS = '''
    def pwn(self):
        import os
        return os.system("touch {marker}")

    def spin(self):
        while True:
            pass
'''
BOMB = "import os\nos.system('touch {marker}')\nwhile True:\n    pass\n"

FUNCTIONS = [
    {"name": "turn_on_wifi", "description": "Turn on WiFi.", "parameters": {"type": "dict", "required": [], "properties": {}}},
    {"name": "buy", "description": "Buy an item.", "parameters": {"type": "dict", "required": ["user", "item"], "properties": {
        "user": {"type": "string"}, "item": {"type": "string"}, "quantity": {"type": "integer"}}}},
]  # fmt: skip


def _state(wifi, ann, orders):
    return [{"BaseApi": {"wifi": wifi}}, {"Shop": {"balance": {"Ann": ann, "Bob": 20.0}, "orders": orders}}]


ITEMS = {
    "multi_step": [
        ("I am Ann. Buy two teas.", {"wifi": True}, _state(True, 40.0, [{"user": "Ann", "item": "tea", "quantity": 2}]),
         ["[buy(user='Ann', item='tea', quantity=2)]"]),
        ("I am Ann. Buy one cake.", {"wifi": False}, _state(True, 38.0, [{"user": "Ann", "item": "cake", "quantity": 1}]),
         [["[turn_on_wifi()]", "[buy(user='Ann', item='cake', quantity=1)]"], ["[turn_on_wifi()]", "[buy(user='Ann', item='cake')]"]]),
    ],
    "multi_turn": [
        ("Your name is Ann. You want one cake.", {"wifi": True}, _state(True, 38.0, [{"user": "Ann", "item": "cake", "quantity": 1}]),
         ["[buy(user='Ann', item='cake', quantity=1)]"]),
    ],
}  # fmt: skip


def make_checkout(root: Path, *, marker: Path | None = None, bomb: bool = False) -> Path:
    """An ACEBench-shaped clone: data_all/data_en + possible_answer + model_inference."""
    mi, data = root / "model_inference", root / "data_all" / "data_en"
    shop = SHOP + (HOSTILE_METHODS.format(marker=marker) if marker else "")
    if bomb:
        shop = BOMB.format(marker=marker) + shop
    files = {
        mi / "multi_turn/scenariosen/phone/base_api.py": BASE,
        mi / "multi_turn/scenariosen/phone/shop.py": shop,
        mi / "multi_step/scenariosen/phone/shop.py": shop,
        mi / "apimodel_inference.py": 'SAVED_CLASS = {"BaseApi": ["wifi"], "Shop": ["balance", "orders"]}\n',
        mi / "prompt_en.py": 'BASE_PROMPT_EN = """The current time is noon. Be brief."""\nTRAVEL_PROMPT_EN = ""\n',
    }
    for cat in ("multi_step", "multi_turn"):
        mapping = {"BaseApi": "model_inference.multi_turn.scenariosen.phone.base_api",
                   "Shop": f"model_inference.{cat}.scenariosen.phone.shop"}  # fmt: skip
        files[mi / cat / f"{cat}_utils.py"] = f"import json\nCLASS_FILE_PATH_MAPPING_EN = {mapping!r}\n"
        rows, answers = [], []
        for i, (question, base, gold, stones) in enumerate(ITEMS[cat]):
            rows.append({"id": f"agent_{cat}_{i}", "question": question, "initial_config": {"BaseApi": base},
                         "path": [], "function": FUNCTIONS, "involved_classes": ["BaseApi", "Shop"]})  # fmt: skip
            answers.append({"id": f"agent_{cat}_{i}", "ground_truth": gold, "mile_stone": stones})
        files[data / f"data_agent_{cat}.json"] = "".join(json.dumps(r) + "\n" for r in rows)
        files[data / "possible_answer" / f"data_agent_{cat}.json"] = "".join(json.dumps(a) + "\n" for a in answers)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


class FakeSimulator:
    """A tiny OpenAI-compatible chat server: the user says what it wants, then its name."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body})
                said = sum(1 for m in body["messages"] if m["role"] == "assistant")
                text = ["I would like to buy a cake.", "I am Ann."][min(said, 1)]
                out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _run(data, reply, out=None, pool=None):
    async def go():
        return await evaluate(["acebench_agent"], Scripted(reply), out=out, model="m", n=1,
                              data=data, pool=pool)  # fmt: skip

    return anyio.run(go).suites["acebench_agent"]


def test_gold_one_wrong_zero_and_multi_turn_skipped_without_a_simulator(tmp_path):
    root = make_checkout(tmp_path / "ACEBench")
    gold = _run({"acebench_agent": str(root)}, gold_reply, out=tmp_path)
    assert gold.metrics == {"multi_step_end_to_end": 1.0, "multi_step_process": 1.0,
                            "agent_multi_step_only": 1.0}  # fmt: skip
    assert gold.notes == [SKIPPED] and gold.n_problems == 2
    rows = [json.loads(x) for x in (tmp_path / "acebench_agent.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["agent_multi_step_0", "agent_multi_step_1"]
    second = rows[1]["transcript"]  # wifi off: the broadcast turn_on_wifi reached the shop
    assert second[0]["role"] == "system" and second[1] == {"role": "user", "content": "I am Ann. Buy one cake."}
    assert [m["role"] for m in second[2:]] == ["assistant", "tool"] * 2 + ["assistant"]
    assert "paid 12.0" in second[5]["content"] and rows[1]["completion"] == "finish conversation"
    # the data_en folder works as DIR too; a wrong engine scores 0 on both halves
    wrong = _run({"acebench_agent": str(root / "data_all" / "data_en")}, wrong_reply)
    assert wrong.metrics["agent_multi_step_only"] == 0.0 and wrong.metrics["multi_step_process"] == 0.0


def test_multi_turn_with_a_fake_openai_compatible_simulator(tmp_path):
    root = make_checkout(tmp_path / "ACEBench")
    with FakeSimulator() as sim:
        data = {"acebench_agent": str(root), "acebench_agent.user_url": sim.url,
                "acebench_agent.user_model": "sim-1"}  # fmt: skip
        gold = _run(data, gold_reply, out=tmp_path)
        wrong = _run(data, wrong_reply)
    assert gold.metrics["agent"] == 1.0 and gold.metrics["multi_turn_end_to_end"] == 1.0
    assert gold.notes == [] and gold.n_problems == 3
    assert wrong.metrics["agent"] == 0.0 and wrong.metrics["multi_turn_end_to_end"] == 0.0
    first = sim.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["body"]["model"] == "sim-1"
    assert "Your name is Ann. You want one cake." in first["body"]["messages"][0]["content"]
    rows = {json.loads(x)["id"]: json.loads(x) for x in (tmp_path / "acebench_agent.jsonl").read_text().splitlines()}
    talk = rows["agent_multi_turn_0"]["transcript"]
    assert "The current time is noon." in talk[0]["content"]  # the checkout's domain rules
    assert [(m["role"], m["content"]) for m in talk[1:4]] == [
        ("user", "I would like to buy a cake."), ("assistant", "Which account should I use?"),
        ("user", "I am Ann.")]  # fmt: skip
    # the simulator saw the agent's question as the user's turn
    assert any(m == {"role": "user", "content": "Which account should I use?"}
               for r in sim.requests for m in r["body"]["messages"])  # fmt: skip


def test_hostile_calls_and_scenarios_are_contained_and_score_zero(tmp_path):
    marker = tmp_path / "pwned"
    attacks = iter(["[pwn()]", "[buy(user=__import__('os').system('touch x'), item='tea')]",
                    "[_load_scenario(scenario={'wifi': True})]", "[spin()]"] * 4)  # fmt: skip

    def hostile(item, messages):
        return next(attacks)

    pool_cfg = PoolConfig(max_workers=4, prewarm=1, call_timeout_s=3.0, open_timeout_s=5.0)

    async def go(data, reply):
        async with EnvPool(pool_cfg) as pool:
            res = await evaluate(["acebench_agent"], Scripted(reply), out=None, model="m", n=1,
                                 data=data, pool=pool)  # fmt: skip
        return res.suites["acebench_agent"]

    root = make_checkout(tmp_path / "hostile", marker=marker)
    calls = anyio.run(go, {"acebench_agent": str(root)}, hostile)
    assert calls.metrics["agent_multi_step_only"] == 0.0
    bomb = make_checkout(tmp_path / "bomb", marker=marker, bomb=True)
    scenes = anyio.run(go, {"acebench_agent": str(bomb)}, gold_reply)
    assert scenes.metrics["agent_multi_step_only"] == 0.0
    assert not marker.exists()


@pytest.mark.parametrize(
    ("breakage", "needle"),
    [
        ("nothing", "has no data folder"),
        ("no_utils", "multi_step_utils.py is missing"),
        ("bad_line", "data_agent_multi_step.json:3: not a JSON line"),
        ("no_map", "no literal CLASS_FILE_PATH_MAPPING_EN"),
        ("bad_option", "unknown option acebench_agent.user"),
    ],
)
def test_bad_data_is_one_line(tmp_path, breakage, needle):
    root = make_checkout(tmp_path / "ACEBench") if breakage != "nothing" else tmp_path / "nope"
    data = {"acebench_agent": str(root)}
    if breakage == "no_utils":
        (root / "model_inference/multi_step/multi_step_utils.py").unlink()
    if breakage == "bad_line":
        with open(root / "data_all/data_en/data_agent_multi_step.json", "a") as f:
            f.write("{not json\n")
    if breakage == "no_map":
        (root / "model_inference/multi_turn/multi_turn_utils.py").write_text("X = 1\n")
    if breakage == "bad_option":
        data["acebench_agent.user"] = "x"
    with pytest.raises(SpadeError) as err:
        make_suite("acebench_agent", data).load(0)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_cli_names_the_expected_checkout(tmp_path, capsys):
    assert main(["eval", "m", "--suites", "acebench_agent", "--data", f"acebench_agent={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "github.com/ACEBench/ACEBench" in err and "\n" not in err and "Traceback" not in err


def test_call_parsing_and_checks():
    assert parse_calls("[buy(user='Ann', quantity=-2), turn_on_wifi()]") == [
        ["buy", {"user": "Ann", "quantity": -2}], ["turn_on_wifi", {}]]  # fmt: skip
    assert parse_calls('<tool_call>{"name": "buy", "arguments": {"user": "Ann"}}</tool_call>') == [["buy", {"user": "Ann"}]]
    for text in ("finish conversation", "Sure! [buy(user='Ann')]", "[]", "[f(x=open('/etc/passwd'))]", ""):
        assert parse_calls(text) is None, text
    gold = _state(True, 40.0, [])
    assert end_to_end(json.loads(json.dumps(gold)), gold) is None
    assert "wrong number" in end_to_end([], gold)
    assert "balance.Ann wrong" in end_to_end(_state(True, 41.0, []), gold)
    renamed = [{"BaseApi": {"wifi": True}}, {"ShopAPI": gold[1]["Shop"]}]  # as ACEBench: not compared
    assert end_to_end(_state(True, 41.0, []), renamed) is None
    stones = [["[a()]", "[b(x=1)]"], ["[c()]"]]
    assert process_accuracy(["[a()]", "junk", "[b( x = 1 )]"], stones) == 1.0
    assert process_accuracy(["[b(x=1)]", "[a()]"], stones) == 0.5


def test_recipe_check_names_an_unknown_suite_option():
    from spade_async.errors import ConfigError
    from spade_async.eval.inloop import check
    from spade_async.eval.types import EvalConfig

    check(EvalConfig(suites=["acebench_agent"], data={"acebench_agent.user_url": "http://h/v1"}))
    with pytest.raises(ConfigError, match="unknown option acebench_agent.user_uri"):
        check(EvalConfig(suites=["acebench_agent"], data={"acebench_agent.user_uri": "http://h/v1"}))
