"""`spade demo` runs configs/cpu-demo.toml through `spade train` and says where results are."""

from spade_async import recipe
from spade_async.cli import demo
from spade_async.cli import train as train_cli


def test_demo_recipe_loads_and_runs_async_on_the_embedded_default():
    cfg = recipe.load(demo.RECIPE)
    assert cfg.model == "smollm2-135m-instruct" and cfg.schedule == "async"
    assert cfg.initial_memory == "configs/demo-envs" and cfg.corpus.path == "embedded"
    assert sorted(p.name for p in demo.DEMO_ENVS.glob("*.py")) == [
        "letter_hunt.py",
        "number_hunt.py",
    ]


def test_demo_passes_the_recipe_and_prints_the_results(monkeypatch, capsys, tmp_path):
    seen = {}
    monkeypatch.setattr(train_cli, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert demo.main(["--run-dir", str(tmp_path / "r"), "--set", "max_steps=1"]) == 0
    assert seen["argv"] == [
        str(demo.RECIPE),
        "--run-dir",
        str(tmp_path / "r"),
        "--set",
        f"initial_memory='{demo.DEMO_ENVS}'",
        "--set",
        "max_steps=1",
    ]
    out = capsys.readouterr().out
    assert (
        "metrics.jsonl" in out and "episodes/" in out and f"spade dashboard {tmp_path / 'r'}" in out
    )
