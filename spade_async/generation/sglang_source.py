"""SGLang's own source, read (never imported) to check what the project sends it.

The pinned release's wheel (``PINNED``, the ``[gpu]`` extra) is fetched once with
``pip download --no-deps`` into ``$SPADE_CACHE/wheels`` (default ``~/.cache/spade-async``)
and read with ``zipfile`` + ``ast``: no CUDA module of SGLang is imported. ``SGLangSource``
answers what the contract tests (``tests/contract``) and the recipe check need:

- ``routes()``: every route of ``sglang/srt/entrypoints/http_server.py`` with its HTTP
  methods, its handler and the request class its body is parsed into;
- ``fields(cls)``: the fields of a request/response class (``io_struct.py``, the typed v1
  API ``sglang/api/v1/api_types.py``, ``sampling_params.py``), base classes included;
- ``handler_keys(path)``: the keys of the JSON objects a route's handler writes;
- ``flags()``: every ``sglang.launch_server`` flag (``server_args.py`` registers the
  dataclass fields of ``sglang/srt/arg_groups/fields/*.py`` as ``--field-name`` plus
  aliases, and a few by hand).

    python -m spade_async.generation.sglang_source fetch        # the wheel, into the cache
    python -m spade_async.generation.sglang_source write-flags  # refresh sglang_flags.txt
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from functools import cache, cached_property
from pathlib import Path

import msgspec

from spade_async.errors import SpadeError

__all__ = ["PINNED", "SGLangSource", "Route", "wheel_path", "pinned_flags", "FLAGS_FILE"]

PINNED = "0.5.23"  # keep equal to the pin in pyproject.toml's [gpu] extra
_PLATFORM = ("cp311", "manylinux_2_34_x86_64")
FLAGS_FILE = Path(__file__).with_name("sglang_flags.txt")

HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
_STRUCT_FILES = (
    "sglang/srt/managers/io_struct.py",
    "sglang/api/v1/api_types.py",
    "sglang/srt/sampling/sampling_params.py",
    "sglang/srt/utils/weight_versions.py",
)
_SERVER_ARGS = "sglang/srt/server_args.py"
WEIGHT_UPDATER = "sglang/srt/managers/scheduler_components/weight_updater.py"
CONSTANTS = "sglang/srt/constants.py"
ENVIRON = "sglang/srt/environ.py"
_ARG_FIELDS = "sglang/srt/arg_groups/fields/"
# routing replay (generation/routed_experts.py): the start-length rule, the rows returned,
# their dtype and layout, the base64 form and the meta_info key
ROUTED_EXPERTS_FILES = (
    "sglang/srt/managers/scheduler.py",
    "sglang/srt/managers/scheduler_components/batch_result_processor.py",
    "sglang/srt/managers/detokenizer_manager.py",
    "sglang/srt/managers/tokenizer_manager.py",
    "sglang/srt/state_capturer/routed_experts.py",
    "sglang/srt/state_capturer/base.py",
)


class Route(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    methods: frozenset[str]
    handler: str
    request: str | None  # the class the body is parsed into (None: no body)


def wheel_path(version: str = PINNED, *, fetch: bool = True) -> Path:
    """The pinned SGLang wheel in the cache; downloaded (no dependencies) when absent."""
    from spade_async.models import cache_root

    folder = cache_root() / "wheels"
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if found or not fetch:
        if not found:
            raise SpadeError(f"no sglang {version} wheel in {folder}; run `{_FETCH_HINT}`")
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    py, plat = _PLATFORM
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--implementation", "cp", "--python-version", py.removeprefix("cp"),
           "--platform", plat, "-d", str(folder), f"sglang=={version}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SpadeError(
            f"could not download the sglang {version} wheel into {folder} ({last}); "
            f"needs PyPI, or copy the wheel there by hand"
        )
    return found[0]


_FETCH_HINT = "python -m spade_async.generation.sglang_source fetch"


class SGLangSource:
    """Parsed source files of one SGLang release (path inside the wheel -> text)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self._trees = {p: ast.parse(t, filename=p) for p, t in files.items()}

    @classmethod
    def from_wheel(cls, wheel: Path) -> SGLangSource:
        wanted = (HTTP_SERVER, _SERVER_ARGS, WEIGHT_UPDATER, CONSTANTS, ENVIRON, *_STRUCT_FILES,
                  *ROUTED_EXPERTS_FILES)  # fmt: skip
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n in wanted or _is_arg_fields(n)]
            missing = [w for w in wanted if w not in names]
            if missing:
                raise SpadeError(f"{wheel.name} lacks {', '.join(missing)}: not an SGLang wheel?")
            return cls({n: z.read(n).decode() for n in names})

    # ---- HTTP routes ----------------------------------------------------------------------
    def routes(self) -> dict[str, Route]:
        return self._routes

    @cached_property
    def _routes(self) -> dict[str, Route]:
        out: dict[str, Route] = {}
        for fn in ast.walk(self._trees[HTTP_SERVER]):
            if not isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef):
                continue
            for dec in fn.decorator_list:
                got = _route_of(dec)
                if got is None:
                    continue
                path, methods = got
                old = out.get(path)
                methods = methods | (old.methods if old else frozenset())
                out[path] = Route(path=path, methods=methods, handler=fn.name, request=_body(fn))
        return out

    def handler_keys(self, path: str) -> set[str]:
        """String keys of the dict literals (and ``d["key"] = ...`` stores) in the handler of
        ``path`` and in the handlers it awaits by name (``return await model_info()``)."""
        route = self.routes()[path]
        fns = {
            f.name: f
            for f in ast.walk(self._trees[HTTP_SERVER])
            if isinstance(f, ast.AsyncFunctionDef | ast.FunctionDef)
        }
        keys: set[str] = set()
        todo, seen = [route.handler], set()
        while todo:
            name = todo.pop()
            if name in seen or name not in fns:
                continue
            seen.add(name)
            for node in ast.walk(fns[name]):
                if isinstance(node, ast.Dict):
                    keys |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
                elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                    if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                        keys.add(node.slice.value)
                elif isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
                    if isinstance(node.value.func, ast.Name):
                        todo.append(node.value.func.id)
        return keys

    def tree(self, path: str) -> ast.Module:
        """The parsed source of one file read from the wheel."""
        return self._trees[path]

    # ---- request/response classes ---------------------------------------------------------
    def fields(self, cls: str, where: str | None = None) -> set[str]:
        """Fields of class ``cls`` (first found in io_struct, api_types, sampling_params, or
        in ``where``), with those of its bases in the same file."""
        for path in (where,) if where else _STRUCT_FILES:
            classes = _classes(self._trees[path])
            if cls in classes:
                return _fields(classes, cls)
            alias = _aliases(self._trees[path]).get(cls)
            if alias:  # a tagged union (FinishReason): the members' fields and the tag
                return {"type"}.union(*(_fields(classes, m) for m in alias if m in classes))
        raise KeyError(f"class {cls} not found in SGLang {where or _STRUCT_FILES}")

    def literal_values(self, cls: str, field: str) -> set[str]:
        """The values of a ``Literal[...]`` field (e.g. ``PauseGenerationReqInput.mode``)."""
        for path in _STRUCT_FILES:
            node = _classes(self._trees[path]).get(cls)
            for s in node.body if node else []:
                if isinstance(s, ast.AnnAssign) and getattr(s.target, "id", "") == field:
                    return {
                        n.value
                        for n in ast.walk(s.annotation)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    }
        raise KeyError(f"{cls}.{field} not found in SGLang {_STRUCT_FILES}")

    def schema(self, cls: str, where: str | None = None) -> dict[str, tuple[tuple, bool]]:
        """{field: (type tree, required)} of a request class, bases included: the tree is
        ``type_tree`` of its annotation; required = no default in SGLang."""
        for path in (where,) if where else _STRUCT_FILES:
            classes = _classes(self._trees[path])
            if cls in classes:
                return _schema(classes, cls)
        raise KeyError(f"class {cls} not found in SGLang {where or _STRUCT_FILES}")

    # ---- behaviour read from the scheduler side -------------------------------------------
    def session_guarded(self) -> set[str]:
        """Methods of SchedulerWeightUpdaterManager that refuse (return success=False) when
        ``self._session is None``: the handlers that need a weight-update session."""
        return {
            fn.name
            for fn in ast.walk(self._trees[WEIGHT_UPDATER])
            if isinstance(fn, ast.FunctionDef) and _guard(fn, ast.Is)
        }

    def session_exclusive(self) -> set[str]:
        """Methods that refuse while a session is open (``self._session is not None``)."""
        return {
            fn.name
            for fn in ast.walk(self._trees[WEIGHT_UPDATER])
            if isinstance(fn, ast.FunctionDef) and _guard(fn, ast.IsNot)
        }

    def memory_types(self) -> list[str]:
        """constants.py GPU_MEMORY_ALL_TYPES, in order (what tags=None means)."""
        consts: dict[str, object] = {}
        for node in self._trees[CONSTANTS].body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if isinstance(node.value, ast.Constant):
                    consts[name] = node.value.value
                elif isinstance(node.value, ast.List):
                    consts[name] = [consts[e.id] for e in node.value.elts]
        return list(consts["GPU_MEMORY_ALL_TYPES"])

    def tag_ops(self, method: str) -> set[str]:
        """How ``method`` of the manager touches ``self.offload_tags`` (add/remove/...)."""
        for fn in ast.walk(self._trees[WEIGHT_UPDATER]):
            if isinstance(fn, ast.FunctionDef) and fn.name == method:
                return {
                    n.func.attr
                    for n in ast.walk(fn)
                    if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and ast.unparse(n.func.value) == "self.offload_tags"
                }
        raise KeyError(method)

    def env_default(self, name: str) -> object:
        """The default of an ``envs`` field in environ.py (``NAME = EnvBool(True)``)."""
        for node in ast.walk(self._trees[ENVIRON]):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
                call = node.value
                if isinstance(call, ast.Call) and call.args:
                    return ast.literal_eval(call.args[0])
        raise KeyError(f"environ.py defines no {name}")

    # ---- server arguments -----------------------------------------------------------------
    def flags(self) -> set[str]:
        return set(self._flags)

    @cached_property
    def _flags(self) -> frozenset[str]:
        out: set[str] = set()
        for path, tree in self._trees.items():
            if _is_arg_fields(path):
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef):
                        out |= _class_flags(node)
        for node in ast.walk(self._trees[_SERVER_ARGS]):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                out |= {a.value for a in node.args if _is_flag(a)}
        return frozenset(out)


def _is_arg_fields(name: str) -> bool:
    return name.startswith(_ARG_FIELDS) and name.endswith(".py")


def _is_flag(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value[:2] == "--"


def _route_of(dec: ast.AST) -> tuple[str, frozenset[str]] | None:
    """``@app.get("/x")`` / ``@app.post`` / ``@app.api_route("/x", methods=[...])``."""
    if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)):
        return None
    if not (isinstance(dec.func.value, ast.Name) and dec.func.value.id == "app"):
        return None
    kind = dec.func.attr
    if not dec.args or not isinstance(dec.args[0], ast.Constant):
        return None  # a path from the environment (os.environ.get): not a fixed route
    path = dec.args[0].value
    if kind in ("get", "post", "put", "delete"):
        return path, frozenset({kind.upper()})
    if kind == "api_route":
        for kw in dec.keywords:
            if kw.arg == "methods" and isinstance(kw.value, ast.List):
                return path, frozenset(e.value for e in kw.value.elts)
    return None


def _body(fn: ast.AST) -> str | None:
    """The class of the handler's body parameter: ``obj: X`` or ``obj: Annotated[X, Body()]``."""
    for arg in fn.args.args:
        ann = arg.annotation
        if isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") == "Annotated":
            ann = ann.slice.elts[0]
        if isinstance(ann, ast.Name) and ann.id not in ("Request", "str", "int", "float"):
            return ann.id
    return None


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _aliases(tree: ast.Module) -> dict[str, list[str]]:
    """``X = Union[A, B, ...]`` at module level -> {X: [A, B, ...]}."""
    out = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Subscript):
            if getattr(n.value.value, "id", "") == "Union" and isinstance(n.targets[0], ast.Name):
                elts = n.value.slice.elts if isinstance(n.value.slice, ast.Tuple) else []
                out[n.targets[0].id] = [e.id for e in elts if isinstance(e, ast.Name)]
    return out


def _fields(classes: dict[str, ast.ClassDef], name: str) -> set[str]:
    node = classes[name]
    out = {
        s.target.id
        for s in node.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out |= _fields(classes, base.id)
    return out


def _guard(fn: ast.FunctionDef, op: type) -> bool:
    """The function opens with ``if self._session <op> None: return ...``."""
    for stmt in fn.body[:2]:
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare):
            t = stmt.test
            if ast.unparse(t.left) == "self._session" and isinstance(t.ops[0], op):
                return any(isinstance(s, ast.Return) for s in stmt.body)
    return False


def _schema(classes: dict[str, ast.ClassDef], name: str) -> dict[str, tuple[tuple, bool]]:
    node = classes[name]
    out: dict[str, tuple[tuple, bool]] = {}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out.update(_schema(classes, base.id))
    for s in node.body:
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
            out[s.target.id] = (type_tree(s.annotation), s.value is None)
    return out


_SCALARS = {"str": "str", "int": "int", "float": "float", "bool": "bool", "bytes": "bytes"}


def type_tree(node: ast.AST) -> tuple:
    """An annotation as a JSON-level type tree: ('str',), ('list', t), ('union', (t, ...)),
    ('literal', (v, ...)), ('dict',), ('any',), ('none',); bytes marked Base64Bytes travel
    as base64 strings over HTTP."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            return ("none",)
        if isinstance(node.value, str):
            return type_tree(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.Name):
        if node.id in _SCALARS:
            return (_SCALARS[node.id],)
        if node.id in ("list", "List", "tuple", "Tuple"):
            return ("list", ("any",))
        if node.id in ("dict", "Dict"):
            return ("dict",)
        return ("any",)  # Any, a struct or an alias from another module: not resolved
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return ("union", (type_tree(node.left), type_tree(node.right)))
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).split(".")[-1]
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return ("union", (type_tree(args[0]), ("none",)))
        if head == "Union":
            return ("union", tuple(type_tree(a) for a in args))
        if head in ("List", "list", "Sequence"):
            return ("list", type_tree(args[0]))
        if head in ("Tuple", "tuple"):
            return ("list", ("any",))
        if head == "Literal":
            return ("literal", tuple(a.value for a in args if isinstance(a, ast.Constant)))
        if head == "Annotated":
            inner = type_tree(args[0])
            if any("Base64Bytes" in ast.unparse(a) for a in args[1:]):
                inner = _b64(inner)
            return inner
        if head in ("Dict", "dict"):
            return ("dict",)
    return ("any",)


def _b64(tree: tuple) -> tuple:
    if tree == ("bytes",):
        return ("str",)
    if tree[0] == "list":
        return ("list", _b64(tree[1]))
    if tree[0] == "union":
        return ("union", tuple(_b64(t) for t in tree[1]))
    return tree


def _class_flags(node: ast.ClassDef) -> set[str]:
    """``name: A[T, "help"]`` -> --name; ``A[T, Arg(cli_name=..., aliases=[...])]`` as told;
    ``Arg(no_cli=True)`` -> none."""
    out: set[str] = set()
    for s in node.body:
        if not (isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)):
            continue
        ann = s.annotation
        if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") == "A"):
            continue
        meta = ann.slice.elts[1] if isinstance(ann.slice, ast.Tuple) else None
        names = ["--" + s.target.id.replace("_", "-")]
        if isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
            kw = {k.arg: k.value for k in meta.keywords}
            if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
                continue
            if isinstance(kw.get("cli_name"), ast.Constant):
                names = [kw["cli_name"].value]
            if isinstance(kw.get("aliases"), ast.List):
                names += [e.value for e in kw["aliases"].elts if _is_flag(e)]
        out |= set(names)
    return out


@cache
def pinned_flags() -> frozenset[str]:
    """The pinned release's launch flags, as shipped in ``sglang_flags.txt`` (a contract test
    keeps the file equal to the wheel's)."""
    lines = FLAGS_FILE.read_text().splitlines()
    return frozenset(x.strip() for x in lines if x.strip() and not x.startswith("#"))


def render_flags(flags: set[str]) -> str:
    head = f"# sglang.launch_server flags of SGLang {PINNED} (written by sglang_source.py)\n"
    return head + "".join(f"{f}\n" for f in sorted(flags))


def main(argv: list[str] | None = None) -> int:
    cmd = (argv if argv is not None else sys.argv[1:]) or ["fetch"]
    try:
        wheel = wheel_path()
        if cmd[0] == "write-flags":
            FLAGS_FILE.write_text(render_flags(SGLangSource.from_wheel(wheel).flags()))
            print(f"wrote {FLAGS_FILE}")
        else:
            print(wheel)
    except SpadeError as exc:
        print(f"sglang_source: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
