"""What the project sends SGLang, collected from the project's own code, and the checks
against SGLang's source (``spade_async.generation.sglang_source``).

Project side, never a hand-copied list:
- ``routes.ENDPOINTS``: the table the client and the CPU engine use (body and reply structs);
- ``raw_http_calls()``: every other HTTP call in ``spade_async`` whose URL ends in a literal
  path (``client.post(f"{url}/pause_generation", json={...})``, as the weight push makes),
  with the keys of its JSON body, found by ``ast``;
- ``launcher_flags()``: the flags ``build_command`` really emits, plus every flag a recipe
  (``configs/*.toml``) passes in ``engine.extra_args``, in its values or its comments.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import msgspec

from spade_async.generation import routes
from spade_async.generation.protocol import SamplingParams
from spade_async.generation.sglang import SGLangConfig, build_command
from spade_async.generation.sglang_source import SGLangSource

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "spade_async"
API_TYPES = "sglang/api/v1/api_types.py"
SAMPLING = "sglang/srt/sampling/sampling_params.py"
_METHODS = {"get": "GET", "post": "POST", "put": "PUT", "delete": "DELETE"}
_PATH = re.compile(r"^/[a-z][a-z0-9_/]*$")

# our reply structs -> the typed v1 API class SGLang writes them from (api_types.py)
REPLY_CLASSES = {
    "GenerateOutput": "GenerateResponse",
    "MetaInfo": "GenerateMetaInfo",
    "FinishReason": "FinishReason",
    "WeightVersionSpan": "WeightVersionSpan",
}


class RawCall(msgspec.Struct, frozen=True):
    where: str  # file:line
    method: str
    path: str
    body_keys: tuple[str, ...]


def struct_fields(t: type) -> list[str]:
    return [f.name for f in msgspec.structs.fields(t)]


def nested_structs(t: type) -> list[type]:
    """``t`` and every Struct type reachable from its fields."""
    out: list[type] = []

    def visit(info: msgspec.inspect.Type) -> None:
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls in out:
                return
            out.append(info.cls)
            for f in info.fields:
                visit(f.type)
        for attr in ("item_type", "types", "key_type", "value_type", "item_types"):
            sub = getattr(info, attr, None)
            for s in sub if isinstance(sub, tuple) else [sub] if sub is not None else []:
                visit(s)

    visit(msgspec.inspect.type_info(t))
    return out


# ---- project side ----------------------------------------------------------------------------
def request_items() -> list[tuple[routes.Endpoint, str]]:
    """(endpoint, field) for every field of every body struct in the endpoint table (the
    nested sampling params are checked on their own)."""
    return [(e, f) for e in routes.ENDPOINTS if e.request for f in struct_fields(e.request)]


def sampling_fields() -> list[str]:
    return struct_fields(SamplingParams)


def reply_items() -> list[tuple[routes.Endpoint, str, str]]:
    """(endpoint, our struct name, field) for every field of every reply struct, nested."""
    return [
        (e, t.__name__, f)
        for e in routes.ENDPOINTS
        if e.reply
        for t in nested_structs(e.reply)
        for f in struct_fields(t)
    ]


# sglang-router's own management routes (a Rust binary: no source to read in its wheel); the
# real router exercises them in tests/integration/test_router.py.
ROUTER_ROUTES = {("spade_async/launch/router.py", "GET", "/workers")}


def raw_http_calls(root: Path = PACKAGE, sources: dict[str, str] | None = None) -> list[RawCall]:
    """HTTP calls outside the endpoint table: ``x.get/post(URL, json=BODY)`` or
    ``submit(x.post, URL, json=BODY)`` where URL ends in a literal path."""
    if sources is None:
        sources = {str(p.relative_to(ROOT)): p.read_text() for p in sorted(root.rglob("*.py"))}
    out: list[RawCall] = []
    for name, text in sources.items():
        tree = ast.parse(text)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(fn):
                if not isinstance(call, ast.Call):
                    continue
                got = _http_call(call)
                if got is None:
                    continue
                method, path = got
                if (name, method, path) in ROUTER_ROUTES:
                    continue
                keys = _body_keys(fn, call)
                out.append(RawCall(f"{name}:{call.lineno}", method, path, tuple(sorted(keys))))
    return out


def _http_call(call: ast.Call) -> tuple[str, str] | None:
    parts = [call.func, *call.args]
    for i, node in enumerate(parts[:-1]):
        if isinstance(node, ast.Attribute) and node.attr in _METHODS:
            path = _url_path(parts[i + 1])
            if path is not None:
                return _METHODS[node.attr], path
    return None


def _url_path(node: ast.AST) -> str | None:
    """The literal path ending a URL built from an engine URL (``f"{url}/x"``,
    ``self.url + "/x"``: the expression before the path names a ``url``)."""
    head = tail = None
    if isinstance(node, ast.JoinedStr) and len(node.values) >= 2:
        head, last = node.values[0], node.values[-1]
        tail = last.value if isinstance(last, ast.Constant) else None
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        head = node.left
        tail = node.right.value if isinstance(node.right, ast.Constant) else None
    if head is None or "url" not in ast.unparse(head).lower():
        return None
    return tail if isinstance(tail, str) and _PATH.match(tail) else None


def _body_keys(fn: ast.AST, call: ast.Call) -> set[str]:
    body = next((k.value for k in call.keywords if k.arg == "json"), None)
    if isinstance(body, ast.Dict):
        return _dict_keys(body)
    if not isinstance(body, ast.Name):
        return set()
    # the last ``name = {...}`` before the call, and ``name["k"] = ...`` between the two
    assigns = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Dict)
        and n.lineno <= call.lineno
        and any(isinstance(t, ast.Name) and t.id == body.id for t in n.targets)
    ]
    if not assigns:
        return set()
    start = max(assigns, key=lambda n: n.lineno)
    keys = _dict_keys(start.value)
    for node in ast.walk(fn):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == body.id:
                if (
                    isinstance(node.slice, ast.Constant)
                    and start.lineno < node.lineno <= call.lineno
                ):
                    keys.add(node.slice.value)
    return keys


def _dict_keys(d: ast.Dict) -> set[str]:
    return {k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def launcher_flags() -> list[str]:
    """Flags ``build_command`` emits (every option on) and those the recipes pass."""
    cfg = SGLangConfig(model_path="m", gpu_ids=[0], deterministic=True)
    argv, _ = build_command(cfg)
    flags = {a for a in argv if a.startswith("--")}
    for recipe in sorted((ROOT / "configs").glob("*.toml")):
        text = recipe.read_text()
        extra = tomllib.loads(text).get("engine", {}).get("extra_args", [])
        flags |= {a.split("=", 1)[0] for a in extra if a.startswith("--")}
        for line in text.splitlines():  # recipes' documented variants, e.g. in comments
            if "extra_args" in line:
                flags |= set(
                    re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", line.split("extra_args", 1)[1])
                )
    return sorted(flags)


# ---- checks: each returns None when fine, else one line naming what is wrong -----------------
def route_problem(src: SGLangSource, method: str, path: str) -> str | None:
    route = src.routes().get(path)
    if route is None:
        return f"SGLang has no route {path}"
    if method not in route.methods:
        return f"SGLang serves {path} with {sorted(route.methods)}, not {method}"
    return None


def request_class(src: SGLangSource, ep_or_path: routes.Endpoint | str) -> str:
    if isinstance(ep_or_path, routes.Endpoint) and ep_or_path.sglang_request:
        return ep_or_path.sglang_request
    path = ep_or_path.path if isinstance(ep_or_path, routes.Endpoint) else ep_or_path
    cls = src.routes()[path].request
    assert cls is not None, f"SGLang's {path} takes no body"
    return cls


def field_problem(src: SGLangSource, cls: str, field: str, where: str | None = None) -> str | None:
    if field in src.fields(cls, where):
        return None
    return f"SGLang's {cls} has no field '{field}'"


# meta_info keys SGLang's tokenizer manager writes by hand (``meta_info["k"] = ...``), which
# the typed v1 GenerateMetaInfo lacks: routed_experts (routing replay)
HAND_WRITTEN_META = {"routed_experts": "sglang/srt/managers/tokenizer_manager.py"}


def meta_info_stores(src: SGLangSource, path: str) -> set[str]:
    """The constant keys of ``meta_info[...] = ...`` stores in ``path``."""
    return {
        node.slice.value
        for node in ast.walk(src.tree(path))
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name) and node.value.id == "meta_info"
        and isinstance(node.slice, ast.Constant)
    }  # fmt: skip


def reply_problem(src: SGLangSource, ep: routes.Endpoint, struct: str, field: str) -> str | None:
    if ep.path == routes.GENERATE.path and struct == "MetaInfo" and field in HAND_WRITTEN_META:
        path = HAND_WRITTEN_META[field]
        return None if field in meta_info_stores(src, path) else f"{path} writes no '{field}'"
    if ep.path == routes.GENERATE.path:
        return field_problem(src, REPLY_CLASSES[struct], field, API_TYPES)
    if field in src.handler_keys(ep.path):
        return None
    return f"SGLang's {ep.path} handler writes no '{field}'"


def flag_problem(src: SGLangSource, flag: str) -> str | None:
    return None if flag in src.flags() else f"sglang.launch_server has no flag {flag}"


# ---- types and required fields ---------------------------------------------------------------
def our_tree(t) -> tuple:
    """A msgspec field type as ``sglang_source.type_tree`` writes SGLang's."""
    return _info_tree(msgspec.inspect.type_info(t))


def _info_tree(info) -> tuple:
    mi = msgspec.inspect
    simple = {mi.StrType: "str", mi.IntType: "int", mi.FloatType: "float", mi.BoolType: "bool",
              mi.NoneType: "none", mi.AnyType: "any", mi.BytesType: "bytes"}  # fmt: skip
    for cls, name in simple.items():
        if isinstance(info, cls):
            return (name,)
    if isinstance(info, mi.LiteralType):
        return ("literal", tuple(info.values))
    if isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        return ("list", _info_tree(info.item_type))
    if isinstance(info, mi.UnionType):
        return ("union", tuple(_info_tree(t) for t in info.types))
    if isinstance(info, mi.StructType | mi.DictType | mi.TypedDictType):
        return ("dict",)
    return ("any",)


def accepts(theirs: tuple, ours: tuple) -> bool:
    """Every JSON value of type ``ours`` is one of type ``theirs``."""
    if theirs[0] == "any":
        return True
    if ours[0] == "union":
        return all(accepts(theirs, o) for o in ours[1])
    if theirs[0] == "union":
        return any(accepts(t, ours) for t in theirs[1])
    if theirs[0] == "literal":
        return ours[0] == "literal" and set(ours[1]) <= set(theirs[1])
    if ours[0] == "literal":
        return all(value_problem(theirs, v) is None for v in ours[1])
    if theirs[0] == "list":
        return ours[0] == "list" and accepts(theirs[1], ours[1])
    if theirs == ("float",):
        return ours in (("float",), ("int",))
    return theirs == ours


def value_problem(tree: tuple, value) -> str | None:
    """None if the JSON ``value`` has type ``tree``, else why not."""
    kind = tree[0]
    ok = {
        "any": lambda v: True,
        "none": lambda v: v is None,
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "dict": lambda v: isinstance(v, dict),
    }
    if kind in ok:
        return None if ok[kind](value) else f"{value!r} is not {kind}"
    if kind == "literal":
        return None if value in tree[1] else f"{value!r} is not one of {list(tree[1])}"
    if kind == "union":
        found = [value_problem(t, value) for t in tree[1]]
        return None if None in found else " and ".join(p for p in found if p)
    if kind == "list":
        if not isinstance(value, list):
            return f"{value!r} is not a list"
        return next((p for p in (value_problem(tree[1], v) for v in value) if p), None)
    return None


def body_problems(src: SGLangSource, path: str, body: dict) -> list[str]:
    """What SGLang's request class for ``path`` would reject in this JSON body: unknown
    keys, missing required fields, values of the wrong type (its HTTP layer validates the
    body into the class before any handler runs)."""
    ep = next((e for e in routes.ENDPOINTS if e.path == path), None)
    if src.routes()[path].request is None and (ep is None or ep.sglang_request is None):
        return [f"{path}: SGLang's handler takes no body, got {sorted(body)}"] if body else []
    cls = request_class(src, ep if ep is not None else path)
    schema = src.schema(cls)
    out = [f"{path}: SGLang's {cls} has no field '{k}'" for k in body if k not in schema]
    out += [
        f"{path}: SGLang's {cls} requires '{k}'"
        for k, (_, required) in schema.items()
        if required and k not in body
    ]
    for k, v in body.items():
        if k in schema and (p := value_problem(schema[k][0], v)) is not None:
            out.append(f"{path}: {cls}.{k}: {p}")
    return out
