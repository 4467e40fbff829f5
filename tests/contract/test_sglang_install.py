"""``pip install -e '.[gpu]'`` resolves to one set: SGLang's own pins (its wheel's
Requires-Dist) win, our core ranges admit them, and flash-attn (a source build) is not in
it but an extra of its own."""

from __future__ import annotations

import re
import tomllib
import zipfile

from contract_checks import ROOT
from packaging.requirements import Requirement

from spade_async.generation.sglang_source import PINNED, wheel_path


def _sglang_requires() -> dict[str, Requirement]:
    with zipfile.ZipFile(wheel_path()) as z:
        meta = z.read(f"sglang-{PINNED}.dist-info/METADATA").decode()
    reqs = [Requirement(x) for x in re.findall(r"^Requires-Dist: (.+)$", meta, re.M)]
    return {r.name.lower().replace("_", "-"): r for r in reqs if "extra" not in str(r.marker)}


def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_gpu_extra_takes_sglangs_pins():
    theirs = _sglang_requires()
    gpu = {
        Requirement(x).name.lower(): Requirement(x)
        for x in _project()["optional-dependencies"]["gpu"]
    }
    for name in ("torch", "transformers"):  # what the trainer imports: under SGLang's pins
        assert str(gpu[name].specifier) == str(theirs[name].specifier), name
    for name, req in gpu.items():
        if name in theirs and str(theirs[name].specifier).startswith("=="):
            assert req.specifier == theirs[name].specifier, (
                f"{name}: {req} vs SGLang's {theirs[name]}"
            )
    assert "flash-attn" not in gpu and "triton" not in gpu  # torch pins its own triton


def test_core_ranges_admit_sglangs_pins():
    theirs = _sglang_requires()
    for dep in _project()["dependencies"]:
        req = Requirement(dep)
        pin = theirs.get(req.name.lower())
        if pin is not None and str(pin.specifier).startswith("=="):
            version = str(pin.specifier).removeprefix("==")
            assert req.specifier.contains(version), f"{req} excludes SGLang's {pin}"


def test_flash_attn_is_its_own_extra():
    extras = _project()["optional-dependencies"]
    assert extras["flash"] == ["flash-attn"]
