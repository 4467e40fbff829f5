"""``spade plan --throughput``'s input checks: its flags and its cost file (issue 45).

A cost file (``--costs FILE``, TOML) adds or overrides ``[gpu.NAME]`` and ``[model.NAME]``
rows of the simulator's cost model (``costs.load_costs`` reads it through ``read_costs``).
Every number in it must be a finite number inside its range (``GPU``, ``MODEL``): a zero
bandwidth, a negative parameter count, ``inf``, ``nan`` or a string where a number goes would
give a traceback or a confident, meaningless table. The first such value is refused in one
line naming it and its range (``ConfigError``: exit 2), as are unknown keys, a file that is
not a plain file (a FIFO would block), larger than ``MAX_BYTES``, not UTF-8 or not TOML.

``steps``/``stalenesses``/``splits`` check the flags the same way. The ranges are
``config_bounds.Range``: the same wording as a recipe's own values.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from spade_async.config_bounds import Range, closed
from spade_async.errors import ConfigError

__all__ = ["GPU", "MODEL", "MAX_BYTES", "read_costs", "check_costs", "steps", "stalenesses",
           "splits"]  # fmt: skip

MAX_BYTES = 1 << 20
# the lower ends are far below any real part: a value there is a unit mistake, not a GPU
GPU: dict[str, Range] = {
    "hbm_tb_s": closed(0.01, 1000),  # TB/s of HBM per GPU
    "bf16_tflops": closed(0.1, 1e6),
    "memory_gib": closed(1, 1e5),
}
MODEL: dict[str, Range] = {
    "params": closed(1e6, 1e15),
    "active_params": closed(1e6, 1e15),
    "layers": closed(1, 10_000),
    "kv_heads": closed(1, 10_000),
    "head_dim": closed(1, 100_000),
}
INTEGERS = {"layers", "kv_heads", "head_dim"}
TEXT = {"source"}
FLAGS = {"moe"}
MAX_STEPS = 1000  # a full table of 16 runs x 9 steps takes minutes
MAX_STALENESS = 64


def _out(where: str, value: Any, must: str) -> ConfigError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ConfigError(f"{where} = {shown} is out of range: must be {must}")


def _number(where: str, value: Any, bound: Range, integer: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _out(where, value, f"{'an integer' if integer else 'a number'} {bound}")
    if integer and not isinstance(value, int):
        raise _out(where, value, f"an integer {bound}")
    if not bound.holds(value):
        raise _out(where, value, str(bound))


def check_costs(raw: Any, path: str | Path) -> None:
    """ConfigError (one line) for the first value of a parsed cost file out of its range."""
    tables = {"gpu": GPU, "model": MODEL}
    for top, rows in raw.items():
        if top not in tables:
            raise ConfigError(
                f"--costs {path}: unknown table [{top}]; write [gpu.NAME] or [model.NAME]"
            )
        if not isinstance(rows, dict) or not all(isinstance(v, dict) for v in rows.values()):
            raise ConfigError(f"--costs {path}: [{top}] holds tables: write [{top}.NAME] with keys")
        bounds = tables[top]
        for name, row in rows.items():
            for key, value in row.items():
                where = f"--costs {path}: {top}.{name}.{key}"
                if key in bounds:
                    _number(where, value, bounds[key], key in INTEGERS)
                elif key in TEXT and isinstance(value, str):
                    continue
                elif top == "model" and key in FLAGS:
                    if not isinstance(value, bool):
                        raise _out(where, value, "true or false")
                else:
                    known = ", ".join([*bounds, *TEXT, *(FLAGS if top == "model" else ())])
                    raise ConfigError(f"{where}: unknown key (known: {known})")
            m = {k: row[k] for k in ("params", "active_params") if k in row}
            if len(m) == 2 and m["active_params"] > m["params"]:
                raise _out(
                    f"--costs {path}: model.{name}.active_params", m["active_params"],
                    f"<= params ({m['params']})",
                )  # fmt: skip


def read_costs(path: str | Path) -> dict:
    """A cost file, parsed and checked (``check_costs``); ConfigError in one line otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ConfigError(f"--costs {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"--costs {path}: not a plain file; give a TOML cost file")
        data = os.read(fd, MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"--costs {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise ConfigError(f"--costs {path}: larger than {MAX_BYTES} bytes; not a cost file")
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"--costs {path}: not UTF-8 text; give a TOML cost file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--costs {path}: not valid TOML: {e}") from None
    check_costs(raw, path)
    return raw


# ---- the flags ---------------------------------------------------------------------------
def steps(value: int | None) -> int:
    """``--steps``: None (0: ``sweep``'s auto, each row until steady) or 1..MAX_STEPS."""
    if value is None:
        return 0
    bound = closed(1, MAX_STEPS)
    if not bound.holds(value):
        raise _out("--steps", value, str(bound))
    return value


def stalenesses(text: str) -> list[int]:
    """``--staleness 0,1,2``: integers in [0, MAX_STALENESS], at least one."""
    bound = closed(0, MAX_STALENESS)
    out = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            s = int(part)
        except ValueError:
            raise _out("--staleness", part.strip(), f"an integer {bound}") from None
        if not bound.holds(s):
            raise _out("--staleness", s, str(bound))
        out.append(s)
    if not out:
        raise _out("--staleness", text, f"comma-separated integers {bound}")
    return out


def splits(text: str, known: tuple[str, ...]) -> list[str]:
    """``--splits 2+6,colocated``: names from ``known``, at least one."""
    out = [s.strip() for s in text.split(",") if s.strip()]
    for s in out:
        if s not in known:
            raise _out("--splits", s, f"one of {', '.join(known)}")
    if not out:
        raise _out("--splits", text, f"comma-separated names from {', '.join(known)}")
    return out
