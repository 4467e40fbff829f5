"""SGLang launcher: commands and request bodies against SGLang's documented API, and the
process lifecycle (health wait, crash restart, stop) against a stand-in server. No GPU."""

from __future__ import annotations

import json
import os
import socket

import anyio
import msgspec
import pytest

from spade_async.errors import ConfigError
from spade_async.generation.client import EngineError
from spade_async.generation.sglang import (
    SGLangConfig,
    SGLangServer,
    build_command,
    weight_group_requests,
)

FAKE = r'''
import argparse, json, os, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer
p = argparse.ArgumentParser()
for a in ("--model-path", "--host", "--port", "--tp-size", "--mem-fraction-static", "--base-gpu-id", "--weight-version"):
    p.add_argument(a)
args, extra = p.parse_known_args()
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "orig_lp": os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB"), "pid": os.getpid()}) + "\n")
if os.environ.get("FAKE_NEVER_HEALTHY"):
    time.sleep(60)
if os.environ.get("FAKE_EXIT_AT_START"):
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: no CUDA device", file=sys.stderr)
    print("shutting down", file=sys.stderr)
    sys.exit(3)
time.sleep(0.3)  # a short "model load"
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
srv = HTTPServer((args.host, int(args.port)), H)
crash = float(os.environ.get("FAKE_CRASH_AFTER", "0"))
if crash and len(open(os.environ["FAKE_RECORD"]).readlines()) == 1:
    threading.Timer(crash, lambda: os._exit(9)).start()
srv.serve_forever()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    (tmp_path / "fake_sglang.py").write_text(FAKE)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FAKE_RECORD", str(record))

    def cfg(**kw):
        base = dict(model_path="/models/m", gpu_ids=[0], port=_free_port(), module="fake_sglang",
                    start_timeout_s=20.0, stop_timeout_s=5.0, log_path=str(tmp_path / "log.txt"))
        return SGLangConfig(**{**base, **kw})

    def records():
        return [json.loads(ln) for ln in record.read_text().splitlines()] if record.exists() else []

    return cfg, records


def test_build_command_matches_launch_server_flags():
    cfg = SGLangConfig(model_path="/ckpt/hf", gpu_ids=[4, 5], tp_size=2, port=30010,
                       mem_fraction_static=0.7, extra_args=["--context-length", "16384"])
    argv, env = build_command(cfg)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags == {"--model-path": "/ckpt/hf", "--host": "127.0.0.1", "--port": "30010",
                     "--tp-size": "2", "--mem-fraction-static": "0.7", "--base-gpu-id": "0",
                     "--weight-version": "0", "--context-length": "16384"}
    assert env == {"CUDA_VISIBLE_DEVICES": "4,5", "SGLANG_RETURN_ORIGINAL_LOGPROB": "0",
                   "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
    with pytest.raises(ConfigError, match=r"tp_size=2 but gpu_ids=\[4\]"):
        build_command(SGLangConfig(model_path="m", gpu_ids=[4], tp_size=2))


def test_weight_group_requests_match_init_weights_update_group():
    reqs = weight_group_requests([2, 2], "10.0.0.1", 29600)
    bodies = [msgspec.to_builtins(r) for r in reqs]
    assert bodies[0] == {"master_address": "10.0.0.1", "master_port": 29600, "rank_offset": 1,
                         "world_size": 5}  # defaults (group_name, backend="nccl") omitted
    assert bodies[1]["rank_offset"] == 3
    full = json.loads(msgspec.json.encode(msgspec.structs.replace(reqs[0], backend="gloo")))
    assert full["backend"] == "gloo"


def test_start_stop_and_restart_after_crash(fake):
    cfg_of, records = fake
    cfg = cfg_of(gpu_ids=[2, 3], tp_size=2, max_restarts=2)
    os.environ["FAKE_CRASH_AFTER"] = "0.5"
    try:
        hooked = []

        async def on_restart(srv):  # the runtime pushes the current weights here
            hooked.append(srv.restarts)

        async def main():
            server = SGLangServer(cfg)
            server.on_restart = on_restart
            server.on_crash = lambda srv: hooked.append(("crash", srv.restarts))
            async with anyio.create_task_group() as tg:
                url = await tg.start(server.run)
                with anyio.fail_after(20):
                    while 1 not in hooked:
                        await anyio.sleep(0.1)
                tg.cancel_scope.cancel()
            return url, server

        url, server = anyio.run(main)
    finally:
        del os.environ["FAKE_CRASH_AFTER"]
    recs = records()
    assert url == f"http://127.0.0.1:{cfg.port}" and server.restarts == 1 and len(recs) == 2
    assert hooked == [("crash", 0), 1]  # on_crash before the restart, on_restart once after
    assert recs[0]["cuda"] == "2,3" and recs[0]["orig_lp"] == "0" and "--tp-size" in recs[0]["argv"]
    for rec in recs:  # everything stopped
        with pytest.raises(ProcessLookupError):
            os.kill(rec["pid"], 0)


def test_start_failures_are_clear(fake, monkeypatch):
    cfg_of, _ = fake
    monkeypatch.setenv("FAKE_EXIT_AT_START", "1")
    with pytest.raises(EngineError, match="exited with status 3 during start-up") as err:
        anyio.run(SGLangServer(cfg_of()).start)
    # which engine, the log's last error line and the log's path, in one line
    msg = str(err.value)
    assert msg.startswith("engine fake_sglang http://") and "\n" not in msg, msg
    assert ": RuntimeError: no CUDA device; log: " in msg and msg.endswith("log.txt"), msg
    monkeypatch.delenv("FAKE_EXIT_AT_START")
    monkeypatch.setenv("FAKE_NEVER_HEALTHY", "1")
    with pytest.raises(EngineError, match="not healthy within 1 s"):
        anyio.run(SGLangServer(cfg_of(start_timeout_s=1.0)).start)


def test_a_start_cut_short_reaps_its_process(fake, monkeypatch):
    """A start cancelled while it waits for /health (a sibling engine failed) still stops
    the server: its process is reaped and its transport closed, not left to the GC (which
    warned 'unclosed transport ... running' in a later test)."""
    cfg_of, records = fake
    monkeypatch.setenv("FAKE_NEVER_HEALTHY", "1")
    made = []
    real = anyio.open_process

    async def spy(*a, **k):
        made.append(await real(*a, **k))
        return made[-1]

    monkeypatch.setattr(anyio, "open_process", spy)

    async def main():
        with anyio.move_on_after(1.0):
            await SGLangServer(cfg_of()).start()

    anyio.run(main)
    (proc,) = made
    assert proc.returncode is not None  # waited for, inside the cancelled scope
    with pytest.raises(ProcessLookupError):
        os.kill(records()[0]["pid"], 0)


@pytest.mark.gpu
def test_real_sglang_server_generates(tiny_model):
    pytest.importorskip("sglang")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from spade_async.generation.client import GenerationClient
    from spade_async.generation.protocol import SamplingParams

    cfg = SGLangConfig(model_path=str(tiny_model), gpu_ids=[0], port=_free_port(), mem_fraction_static=0.3)

    async def main():
        async with SGLangServer(cfg) as server, GenerationClient([server.url]) as client:
            return await client.generate([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0))

    res = anyio.run(main)
    assert len(res.output_ids) == 4 and len(res.logprobs) == 4


@pytest.mark.gpu
def test_real_sglang_contract_paths(tiny_model):
    """On a GPU node with the pinned SGLang: seeded plays repeat under deterministic
    inference, the version comes from /model_info and meta_info, a push paused with
    ``retract`` lands (and flushes), memory release/resume round-trips. Not run on CPU."""
    pytest.importorskip("sglang")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from spade_async.generation.client import GenerationClient
    from spade_async.generation.protocol import SamplingParams

    cfg = SGLangConfig(model_path=str(tiny_model), gpu_ids=[0], port=_free_port(),
                       mem_fraction_static=0.3, deterministic=True,
                       extra_args=["--enable-memory-saver"])
    ids = [1, 2, 3, 4]
    sp = SamplingParams(max_new_tokens=8, temperature=0.8, sampling_seed=5)

    async def main():
        async with SGLangServer(cfg) as server, GenerationClient([server.url]) as client:
            url = server.url
            a, b = await client.generate(ids, sp), await client.generate(ids, sp)
            assert a.output_ids == b.output_ids  # sampling_seed honoured
            assert a.weight_version == a.policy_version == "0"
            assert (await client.weight_versions()) == {url: "0"}
            await client.pause("retract")
            pushed = await client.update_weights_from_disk(str(tiny_model), weight_version="1")
            await client.flush_cache()  # legal while paused with retract
            await client.resume()
            assert pushed == {url: "1"}
            c = await client.generate(ids, sp)
            assert c.weight_version == c.policy_version == "1" and c.output_ids == a.output_ids
            await client.release_memory()
            await client.resume_memory(["weights"])
            await client.update_weights_from_disk(str(tiny_model), weight_version="2")
            await client.resume_memory(["kv_cache", "cuda_graph"])  # what release() took
            d = await client.generate(ids, sp)
            assert d.weight_version == "2" and d.output_ids == a.output_ids

    anyio.run(main)


def test_reproducible_plays_pass_deterministic_inference():
    """SGLang honours sampling_seed only under --enable-deterministic-inference."""
    argv, _ = build_command(SGLangConfig(model_path="m", gpu_ids=[0], deterministic=True))
    assert argv.count("--enable-deterministic-inference") == 1
    argv, _ = build_command(SGLangConfig(
        model_path="m", gpu_ids=[0], deterministic=True,
        extra_args=["--enable-deterministic-inference"]))
    assert argv.count("--enable-deterministic-inference") == 1  # not twice
    argv, _ = build_command(SGLangConfig(model_path="m", gpu_ids=[0]))
    assert "--enable-deterministic-inference" not in argv


def test_engine_config_deterministic_reaches_the_launcher(tmp_path):
    from spade_async.engines import EngineConfig, servers

    cfg = EngineConfig(kind="sglang", gpus=[[0]], deterministic=True, base_port=31000)
    (server,) = servers(cfg, "/m", tmp_path)
    assert "--enable-deterministic-inference" in server.argv


def test_a_flag_the_pinned_release_lacks_fails_at_start():
    with pytest.raises(ConfigError, match=r"--enable-memory-savr is not a flag of SGLang 0\.5\.23"
                       r".*did you mean --enable-memory-saver\?"):
        build_command(SGLangConfig(model_path="m", gpu_ids=[0],
                                   extra_args=["--enable-memory-savr"]))
    build_command(SGLangConfig(model_path="m", gpu_ids=[0], extra_args=["--context-length=8192"]))


@pytest.mark.parametrize("dry", [True, False])
def test_recipe_with_an_unknown_sglang_flag_exits_2_in_one_line(dry, capsys, tmp_path):
    from spade_async.cli import main

    argv = ["train", "configs/qwen3-8b-games.toml", "--run-dir", str(tmp_path / "run"),
            "--set", 'engine.extra_args=["--enable-determinstic-inference"]']
    with monkeypatch_cwd():
        rc = main(argv + (["--dry-run"] if dry else []))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "--enable-determinstic-inference is not a flag of SGLang" in err[0]
    assert "did you mean --enable-deterministic-inference?" in err[0]
    assert not (tmp_path / "run").exists()  # nothing created


def monkeypatch_cwd():
    import contextlib
    import os
    from pathlib import Path

    @contextlib.contextmanager
    def cd():
        old = os.getcwd()
        os.chdir(Path(__file__).resolve().parents[2])
        try:
            yield
        finally:
            os.chdir(old)

    return cd()
