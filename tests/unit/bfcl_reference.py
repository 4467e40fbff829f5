"""bfcl-eval's own evaluation code, imported for the agreement tests.

``bfcl_eval.eval_checker.eval_runner`` (the per-entry verdicts), ``eval_runner_helper`` (the
leaderboard arithmetic) and ``QwenFCHandler`` (the reference handle's decoding and prompt)
import modules the project does not install (bfcl-eval is installed ``--no-deps``): vendor
SDKs, tree-sitter, pandas. None of them is used on the paths these tests take (decoding
Qwen's JSON tool calls, checking, averaging), so stand-ins with the imported names are put
in ``sys.modules`` first, in this test process only. The code under test is the package's.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import types

MODEL = "Qwen/Qwen3-4B-Instruct-2507-FC"


_STUBS: list[str] = []


def _stub(name: str, **attrs) -> None:
    if name in sys.modules or importlib.util.find_spec(name.split(".")[0]) is not None:
        return  # the real module is there: use it
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    _STUBS.append(name)


def _missing(*_a, **_k):
    raise AssertionError("a stand-in module was used: the agreement test left its path")


def load() -> types.SimpleNamespace:
    os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(tempfile.gettempdir(), "spade-bfcl"))

    def ident(f=None, *a, **k):
        return f if callable(f) else ident

    _stub("overrides", override=ident, final=ident, EnforceOverrides=type("E", (), {}))
    _stub("openai", OpenAI=type("OpenAI", (), {"__init__": lambda self, *a, **k: None}))
    # the Java/JavaScript parsers build their grammars at import; parsing is never reached
    _stub(
        "tree_sitter",
        Language=lambda *a: None,
        Parser=type("P", (), {"parse": _missing, "set_language": lambda self, lang: None}),
    )
    _stub("tree_sitter_java", language=lambda: None)
    _stub("tree_sitter_javascript", language=lambda: None)
    _stub("tenacity", retry=ident, retry_if_exception_message=_missing,
          retry_if_exception_type=_missing, wait_random_exponential=_missing)  # fmt: skip
    _stub("pandas", read_csv=_missing, DataFrame=_missing)
    _stub("dotenv", load_dotenv=_missing)
    _stub("tqdm", tqdm=_missing)
    from spade_async.eval.suites import bfcl_lib

    bfcl_lib._ast_checker()  # the model_config stand-in (the reference's handle only)
    mc = sys.modules["bfcl_eval.constants.model_config"]
    try:
        from bfcl_eval.eval_checker import eval_runner, eval_runner_helper
        from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler
    finally:  # the imports hold what they took; nothing else in this process sees a stand-in
        for name in _STUBS:
            sys.modules.pop(name, None)
        _STUBS.clear()

    cfg = mc.MODEL_CONFIG_MAPPING[MODEL]  # the fields of the real entry the reports read
    cfg.__dict__.update(model_handler=QwenFCHandler, display_name="Qwen3-4B-Instruct-2507 (FC)",
                        url="https://huggingface.co/Qwen/Qwen3-4B-Instruct-2507", org="Qwen",
                        license="apache-2.0", input_price=None, output_price=None,
                        is_fc_model=True, model_name="Qwen/Qwen3-4B-Instruct-2507")  # fmt: skip
    handler = QwenFCHandler("Qwen/Qwen3-4B-Instruct-2507", 0.0, MODEL, True)
    return types.SimpleNamespace(runner=eval_runner, helper=eval_runner_helper, handler=handler)
