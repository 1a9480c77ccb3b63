"""The client library and the `lineage` command, without the engine.

Covers argument wiring, serve flags -> EngineConfig, request conversion, the
event and Result shapes, stream cancellation, the fanout prompt generator and
cluster.yaml. The wire path runs against `FakeEngine`, a tiny in-process gRPC
servicer on port 0 (no MLX, no Ray). `run_cli(argv)` is reusable by
end-to-end tests against a real engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from clients import cli, client as lc, fanout
from clients.chat import Chat, run_chat
from engine.config import GB
from engine.proto import engine_pb2, engine_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]


def run_cli(argv: list[str], stdin: str = "", env: dict | None = None) -> tuple[int, str]:
    """Run `lineage argv` in-process: (exit code, stdout). stderr passes through."""
    out = io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out):
            code = cli.main(argv, env={} if env is None else env)
    finally:
        sys.stdin = old_stdin
    return code, out.getvalue()


# ------------------------------------------------------------ fake engine ----


class FakeEngine(engine_pb2_grpc.EngineServicer):
    """Words as tokens; cached = longest common prefix with any earlier prompt.

    Prompt text "boom" aborts with INVALID_ARGUMENT; "slow" streams until cancelled.
    """

    def __init__(self):
        self.seen: list[list[str]] = []
        self.requests: list[engine_pb2.GenerateRequest] = []
        self.cancelled = threading.Event()

    def _tokens(self, r: engine_pb2.GenerateRequest) -> list[str]:
        text = r.tools_json + " ".join(f"<{m.role}> {m.content}" for m in r.messages)
        return (text + r.prompt_text).split() + [str(i) for i in r.prompt_ids.ids]

    def Generate(self, request, context):
        self.requests.append(request)
        if request.prompt_text == "boom":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad prompt: boom")
        tokens = self._tokens(request)
        cached = max((len(_common(tokens, s)) for s in self.seen), default=0)
        self.seen.append(tokens)
        yield engine_pb2.GenerateEvent(progress=engine_pb2.PrefillProgress(done=len(tokens),
                                                                           total=len(tokens)))
        n = request.sampling.max_tokens
        if request.prompt_text == "slow":
            context.add_callback(self.cancelled.set)
            n = 10_000
        for i in range(n):
            if request.prompt_text == "slow":
                time.sleep(0.01)
            yield engine_pb2.GenerateEvent(chunk=engine_pb2.TokenChunk(ids=[i], text=f" w{i}"))
        yield engine_pb2.GenerateEvent(final=engine_pb2.Final(
            finish_reason="length", request_id=request.request_id or "req-1",
            usage=engine_pb2.Usage(prompt_tokens=len(tokens), cached_tokens=cached,
                                   completion_tokens=n),
            restore=engine_pb2.Restore(kind="entry" if cached else "none", length=cached),
            timing=engine_pb2.Timing(ttft_ms=1.5, decode_tps=100.0, restored_kv_bytes=7)))

    def CacheStats(self, request, context):
        return engine_pb2.CacheStatsReply(mode="lineage", entries=3, hits={"entry": 2},
                                          ram_bytes=5 << 30, prompt_tokens=100, cached_tokens=90)

    def ModelInfo(self, request, context):
        return engine_pb2.ModelInfoReply(model="fake", model_type="qwen3_next", vocab_size=10)


def _common(a: list, b: list) -> list:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@pytest.fixture
def fake():
    """(servicer, "127.0.0.1:port") of a running FakeEngine with health SERVING."""
    servicer = FakeEngine()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    engine_pb2_grpc.add_EngineServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_servicer.set(lc.ENGINE_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -------------------------------------------------------------- argparse ----


@pytest.mark.parametrize("argv", [
    ["serve"],
    ["serve", "--model", "/m", "--cache-mode", "off", "--ram-budget", "1G"],
    ["generate", "--prompt", "hi"],
    ["generate", "--messages", "m.json", "--tools", "t.json", "--stop", "a", "--stop", "b",
     "--json", "--seed", "3", "--top-k", "5", "--top-p", "0.9", "--temperature", "0.7"],
    ["chat", "--system", "be brief", "--tools", "t.json", "--max-tokens", "8"],
    ["fanout", "--agents", "4", "--turns", "3", "--system-tokens", "500", "--json", "o.json"],
    ["stats", "--json", "--server", "h:1"],
])
def test_every_subcommand_parses(argv):
    args = cli.build_parser().parse_args(argv)
    assert args.command == argv[0] and callable(args.run)


@pytest.mark.parametrize("argv", [
    [], ["nope"], ["generate"], ["generate", "--prompt", "a", "--messages", "m.json"],
    ["serve", "--cache-mode", "bogus"], ["serve", "--ram-budget", "lots"],
    ["fanout", "--agents", "2"],
])
def test_usage_errors_exit_2(argv):
    assert run_cli(argv)[0] == 2


def test_parse_leaves_unset_serve_flags_none():
    args = cli.build_parser().parse_args(["serve"])
    assert all(getattr(args, name) is None for name in cli.SERVE_FLAGS)


def test_serve_flags_land_in_engine_config(tmp_path):
    args = cli.build_parser().parse_args([
        "serve", "--model", "/models/m", "--host", "0.0.0.0", "--port", "6000",
        "--cache-dir", str(tmp_path), "--cache-mode", "exact", "--ram-budget", "1G",
        "--disk-budget", "2G", "--address", "auto", "--http-port", "8080",
        "--prefill-step-size", "256", "--max-batch", "4"])
    c = cli.config_from_args(args, {"LINEAGE_PORT": "7000", "LINEAGE_MAX_BATCH": "2"})
    assert (c.model.path, c.model.prefill_step_size, c.model.max_batch) == ("/models/m", 256, 4)
    assert (c.server.host, c.server.port, c.server.address, c.server.http_port) == (
        "0.0.0.0", 6000, "auto", 8080)
    assert (c.cache.mode, c.cache.cache_dir, c.cache.ram_budget) == ("exact", str(tmp_path), GB)
    assert c.cache.disk_budget == min(2 * GB, shutil.disk_usage(tmp_path).free // 2)


def test_serve_env_applies_where_no_flag_is_given():
    args = cli.build_parser().parse_args(["serve", "--max-batch", "4"])
    c = cli.config_from_args(args, {"LINEAGE_PORT": "7000", "LINEAGE_MAX_BATCH": "2",
                                    "APC_LINEAGE": "0"})
    assert (c.server.port, c.model.max_batch, c.cache.mode) == (7000, 4, "exact")


def test_serve_runs_engine_serve_with_the_config(monkeypatch):
    import types

    import engine

    seen = []
    fake_serve = types.ModuleType("engine.serve")
    fake_serve.run = lambda config: seen.append(config) or 0
    monkeypatch.setitem(sys.modules, "engine.serve", fake_serve)
    monkeypatch.setattr(engine, "serve", fake_serve, raising=False)
    assert run_cli(["serve", "--port", "1234", "--cache-mode", "off"])[0] == 0
    assert (seen[0].server.port, seen[0].cache.mode) == (1234, "off")


def test_plugin_registry_adds_a_subcommand(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "bench", cli.Command(
        "bench", "benchmarks", lambda p: p.add_argument("--n", type=int), lambda a: a.n))
    assert run_cli(["bench", "--n", "7"])[0] == 7


def test_cli_imports_neither_mlx_nor_ray():
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('mlx', 'mlx_lm', 'ray'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from clients import cli, chat, fanout\n"
        "cli.build_parser().parse_args(['generate', '--prompt', 'x'])\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ---------------------------------------------------------- conversions ----


def test_result_to_json_dict_shape():
    r = lc.Result("hi", (1, 2), "stop", lc.Usage(10, 8, 2), lc.Restore("anchor", 8),
                  lc.Timing(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), "rid")
    d = r.to_json_dict()
    assert d == {"text": "hi", "token_ids": [1, 2], "finish_reason": "stop",
                 "usage": {"prompt_tokens": 10, "cached_tokens": 8, "completion_tokens": 2},
                 "restore": {"kind": "anchor", "length": 8},
                 "timing": {"queue_ms": 1, "plan_ms": 2, "restore_ms": 3, "prefill_ms": 4,
                            "commit_ms": 5, "ttft_ms": 6, "decode_tps": 7}}
    json.dumps(d)


@pytest.mark.parametrize("message, expected", [
    ({"role": "user", "content": "hi"}, dict(role="user", content="hi")),
    ({"role": "assistant", "content": None}, dict(role="assistant", content="")),
    ({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
     dict(role="user", content="ab")),
    ({"role": "tool", "content": "42", "tool_call_id": "c1", "name": "calc"},
     dict(role="tool", content="42", tool_call_id="c1", name="calc")),
    ({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}},
        {"id": "c3", "name": "h", "arguments": "{}"}]},
     dict(role="assistant", content="", tool_calls=[
         engine_pb2.ToolCall(id="c1", name="f", arguments='{"x": 1}'),
         engine_pb2.ToolCall(id="c2", name="g", arguments='{"y": 2}'),
         engine_pb2.ToolCall(id="c3", name="h", arguments="{}")])),
])
def test_message_to_proto(message, expected):
    assert lc.message_to_proto(message) == engine_pb2.Message(**expected)


@pytest.mark.parametrize("bad", [
    {"content": "no role"}, "text", {"role": "user", "content": [{"type": "image_url"}]},
    {"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]},
])
def test_bad_message_raises_value_error(bad):
    with pytest.raises(ValueError):
        lc.message_to_proto(bad)


def test_build_request():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    r = lc.build_request(messages=[{"role": "user", "content": "x"}], tools=tools, max_tokens=5,
                         stop="END", seed=0, namespace="ns", request_id="r1")
    assert json.loads(r.tools_json) == tools and r.add_generation_prompt
    assert (r.sampling.max_tokens, list(r.sampling.stop), r.sampling.seed) == (5, ["END"], 0)
    assert r.sampling.HasField("seed") and (r.namespace, r.request_id) == ("ns", "r1")
    assert not lc.build_request(prompt="p").sampling.HasField("seed")
    ids = lc.build_request(prompt_ids=[3, 4])
    assert ids.HasField("prompt_ids") and list(ids.prompt_ids.ids) == [3, 4]


@pytest.mark.parametrize("kwargs", [
    {}, {"prompt": "a", "prompt_ids": [1]}, {"messages": []},
    {"prompt": "a", "tools": [{"type": "function"}]}, {"prompt": "a", "max_tokens": 0},
    {"messages": [{"role": "user", "content": "x"}], "tools": "not a list"},
])
def test_bad_request_raises_value_error(kwargs):
    with pytest.raises(ValueError):
        lc.build_request(**kwargs)


def test_event_from_proto_and_message_to_dict():
    assert lc.event_from_proto(engine_pb2.GenerateEvent(
        progress=engine_pb2.PrefillProgress(done=1, total=2))) == lc.Progress(1, 2)
    assert lc.event_from_proto(engine_pb2.GenerateEvent(
        chunk=engine_pb2.TokenChunk(ids=[5], text="x"))) == lc.Chunk((5,), "x")
    final = lc.event_from_proto(engine_pb2.GenerateEvent(final=engine_pb2.Final(
        finish_reason="stop", timing=engine_pb2.Timing(bytes_copied_commit=9))))
    assert final.restore.kind == "none" and final.timing.bytes_copied_commit == 9
    d = lc.message_to_dict(engine_pb2.CacheStatsReply(ram_bytes=1 << 40, hits={"anchor": 1}))
    assert d["ram_bytes"] == 1 << 40 and d["hits"] == {"anchor": 1} and d["evictions"] == 0


# ------------------------------------------------------ client over wire ----


def test_generate_stream_stats_and_health(fake):
    servicer, address = fake
    with lc.Client(address) as c:
        c.wait_ready(5)
        c.wait_ready(5, service=lc.ENGINE_SERVICE)
        r = c.generate(prompt="a b c", max_tokens=3)
        assert (r.text, r.token_ids, r.finish_reason) == (" w0 w1 w2", (0, 1, 2), "length")
        assert (r.usage.prompt_tokens, r.timing.ttft_ms, r.timing.restored_kv_bytes) == (3, 1.5, 7)
        events = list(c.stream(prompt="a b d", max_tokens=1))
        assert [type(e) for e in events] == [lc.Progress, lc.Chunk, lc.Final]
        assert events[-1].usage.cached_tokens == 2 and events[-1].restore.kind == "entry"
        assert c.cache_stats()["hits"] == {"entry": 2} and c.model_info()["model"] == "fake"


def test_errors_surface_as_lineage_error(fake):
    _, address = fake
    with lc.Client(address) as c, pytest.raises(lc.LineageError) as info:
        c.generate(prompt="boom")
    assert (info.value.code, info.value.message) == ("INVALID_ARGUMENT", "bad prompt: boom")
    with lc.Client(f"127.0.0.1:{_free_port()}") as c:
        with pytest.raises(lc.LineageError) as info:
            c.wait_ready(0.3)
        assert info.value.code == "DEADLINE_EXCEEDED"


@pytest.mark.parametrize("how", ["break", "cancel", "close"])
def test_sync_stream_cancels_the_call(fake, how):
    servicer, address = fake
    with lc.Client(address) as c:
        stream = c.stream(prompt="slow")
        for event in stream:
            if isinstance(event, lc.Chunk):
                if how == "break":
                    break
                getattr(stream, how)()
        assert servicer.cancelled.wait(5)
        assert list(stream) == []


def test_async_client_generate_and_task_cancel(fake):
    servicer, address = fake

    async def main():
        async with lc.AsyncClient(address) as c:
            await c.wait_ready(5)
            r = await c.generate(messages=[{"role": "user", "content": "x"}], max_tokens=2)
            assert r.token_ids == (0, 1)
            stream = c.stream(prompt="slow")
            task = asyncio.create_task(stream.result())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await asyncio.to_thread(servicer.cancelled.wait, 5)
            servicer.cancelled.clear()
            second = c.stream(prompt="slow")
            async for event in second:
                if isinstance(event, lc.Chunk):
                    second.cancel()
            assert await asyncio.to_thread(servicer.cancelled.wait, 5)
            assert (await c.cache_stats())["entries"] == 3

    asyncio.run(main())


# ------------------------------------------------------------ cli, wire ----


def test_cli_generate_json_and_text(fake, tmp_path):
    servicer, address = fake
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "user", "content": "hello"}]))
    tools = tmp_path / "t.json"
    tools.write_text(json.dumps(fanout.make_tools(200)))
    code, out = run_cli(["generate", "--messages", str(messages), "--tools", str(tools),
                         "--max-tokens", "2", "--json", "--server", address])
    assert code == 0 and json.loads(out)["token_ids"] == [0, 1]
    assert json.loads(servicer.requests[-1].tools_json)[0]["function"]["name"] == "read_file"
    code, out = run_cli(["generate", "--prompt", "x", "--max-tokens", "2"],
                        env={"LINEAGE_SERVER": address})
    assert (code, out) == (0, " w0 w1\n")


@pytest.mark.parametrize("argv, code", [
    (["generate", "--prompt", "boom"], 1),
    (["generate", "--messages", "/nonexistent.json"], 2),
    (["generate", "--prompt", "x", "--tools", "t.json"], 2),
    (["generate", "--prompt", "x", "--max-tokens", "0"], 2),
])
def test_cli_generate_errors(fake, argv, code):
    assert run_cli(argv + ["--server", fake[1]])[0] == code


def test_cli_generate_unreachable_server_exits_1():
    assert run_cli(["generate", "--prompt", "x", "--server", f"127.0.0.1:{_free_port()}"])[0] == 1


def test_cli_chat_resends_the_conversation(fake):
    servicer, address = fake
    code, out = run_cli(["chat", "--system", "be brief", "--max-tokens", "2", "--server",
                         address], stdin="hello\n\nagain\n/exit\nnever sent\n")
    assert code == 0 and out.count("[prompt ") == 2 and "restore entry" in out
    roles = [[m.role for m in r.messages] for r in servicer.requests]
    assert roles == [["system", "user"], ["system", "user", "assistant", "user"]]
    assert servicer.requests[1].messages[2].content == " w0 w1"


def test_chat_drops_a_failed_turn_and_stops_when_unavailable():
    class Down:
        def stream(self, **request):
            raise lc.LineageError("UNAVAILABLE", "down")

    chat = Chat("sys")
    out, err = io.StringIO(), io.StringIO()
    assert run_chat(Down(), chat, {}, io.StringIO("hi\n"), out, err) == 1
    assert chat.messages == [{"role": "system", "content": "sys"}] and "down" in err.getvalue()


def test_cli_fanout_and_stats(fake, tmp_path):
    _, address = fake
    path = tmp_path / "rows.json"
    code, out = run_cli(["fanout", "--agents", "2", "--turns", "2", "--system-tokens", "300",
                         "--json", str(path), "--server", address])
    data = json.loads(path.read_text())
    assert code == 0 and [(r["agent"], r["turn"]) for r in data["rows"]] == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert data["summary"]["cached_tokens"] > 0 and "total:" in out
    code, out = run_cli(["stats", "--server", address])
    assert code == 0 and "ram_bytes" in out and "5.0 GiB" in out and "90.0%" in out
    code, out = run_cli(["stats", "--json", "--server", address])
    assert json.loads(out)["entries"] == 3


# ---------------------------------------------------------------- fanout ----


@pytest.mark.parametrize("size", [500, 2000, 10000])
def test_shared_prefix_is_deterministic_and_sized(size):
    system, tools = fanout.make_shared_prefix(size, seed=1)
    assert (system, tools) == fanout.make_shared_prefix(size, seed=1)
    assert system != fanout.make_shared_prefix(size, seed=2)[0]
    total = fanout.estimate_tokens(system) + fanout.estimate_tokens(json.dumps(tools))
    assert 0.9 * size <= total <= size and len(tools) >= 1
    assert all(t["function"]["parameters"]["type"] == "object" for t in tools)


def test_user_messages_are_deterministic_and_distinct():
    assert fanout.user_message(1, 2, 0) == fanout.user_message(1, 2, 0)
    assert len({fanout.user_message(a, t, 0) for a in range(4) for t in range(3)}) == 12


# ----------------------------------------------------------- cluster.yaml ----


def test_cluster_yaml():
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
    assert any("pip install -e ." in c for c in config["setup_commands"])
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        commands = config[key]
        assert "ray stop" in commands[0]
        start = commands[-1]
        assert """--resources='{"mlx": 1}'""" in start
        assert "export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1" in start


def test_cluster_yaml_passes_rays_schema():
    pytest.importorskip("ray.autoscaler")
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(yaml.safe_load((ROOT / "cluster.yaml").read_text())))
