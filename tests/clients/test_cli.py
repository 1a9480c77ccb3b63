"""The `lineage` command: its arguments, its settings, and its subcommands on the wire.

Covers argument wiring, serve flags -> EngineConfig, the fanout prompt
generator and cluster.yaml (pure), and the generate, chat, fanout and stats
subcommands against the real engine (the session `engine` fixture: real gRPC
on localhost, real Ray actors, real MLX). The client library under them is
tests/clients/test_client.py's. Each test that relies on the cache uses a
namespace of its own (tests.clients.isolation). `run_cli(argv)` runs
`lineage argv` in-process.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from clients import client as lc
from clients import fanout
from clients.cli import bench
from clients.cli import main as cli
from clients.cli.args import config_from_args, format_stats
from clients.cli.chat import Chat, run_chat
from engine.config import GB
from engine.config.catalog import SETTINGS
from tests.clients.isolation import free_port, fresh_ns

ROOT = Path(__file__).resolve().parents[2]


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


# -------------------------------------------------------------- argparse ----


@pytest.mark.parametrize(
    "argv",
    [
        ["serve"],
        ["serve", "--model", "/m", "--cache-mode", "off", "--ram-budget", "1G"],
        ["generate", "--prompt", "hi"],
        [
            "generate",
            "--messages",
            "m.json",
            "--tools",
            "t.json",
            "--stop",
            "a",
            "--stop",
            "b",
            "--json",
            "--seed",
            "3",
            "--top-k",
            "5",
            "--top-p",
            "0.9",
            "--temperature",
            "0.7",
        ],
        ["chat", "--system", "be brief", "--tools", "t.json", "--max-tokens", "8"],
        ["fanout", "--agents", "4", "--turns", "3", "--system-tokens", "500", "--json", "o.json"],
        ["stats", "--json", "--server", "h:1"],
        ["top", "--once", "--auth-token", "t"],
        ["cache", "ls", "--cache-dir", "/tmp/c"],
        ["bridge", "--port", "0", "--max-body-bytes", "1M", "--insecure"],
        ["bench", "warm", "--turns", "2"],
    ],
)
def test_every_subcommand_parses(argv):
    args = cli.build_parser().parse_args(argv)
    assert args.command == argv[0] and callable(args.run)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["generate"],
        ["generate", "--prompt", "a", "--messages", "m.json"],
        ["serve", "--cache-mode", "bogus"],
        ["serve", "--ram-budget", "lots"],
        ["fanout", "--agents", "2"],
    ],
)
def test_usage_errors_exit_2(argv):
    assert run_cli(argv)[0] == 2


@pytest.mark.parametrize(
    "argv, env, flag",
    [
        (["serve", "--schedule", "lifo"], {}, "--schedule"),
        (["serve", "--prefill-budget", "0"], {}, "--prefill-budget"),
        (["serve", "--prefill-budget", "-64"], {}, "--prefill-budget"),
        (["serve"], {"LINEAGE_SCHEDULE": "lifo"}, "--schedule"),
        (["serve"], {"LINEAGE_PREFILL_BUDGET": "0"}, "--prefill-budget"),
        (["serve"], {"LINEAGE_PREFILL_BUDGET": "many"}, "--prefill-budget"),
        (["serve", "--prefill-group", "0"], {}, "--prefill-group"),
        (["serve", "--prefill-step-factor", "1"], {}, "--prefill-step-factor"),
        (["serve"], {"LINEAGE_PREFILL_STEP_FACTOR": "fast"}, "--prefill-step-factor"),
        (["serve", "--prefill-slice-ms", "0"], {}, "--prefill-slice-ms"),
        (["serve"], {"LINEAGE_PREFILL_SLICE_MS": "-5"}, "--prefill-slice-ms"),
        (["serve", "--prefill-overlap", "maybe"], {}, "--prefill-overlap"),
        (["serve"], {"LINEAGE_PREFILL_OVERLAP": "maybe"}, "--prefill-overlap"),
        (["serve", "--prefill-eval", "layer"], {}, "--prefill-eval"),
        (["serve"], {"LINEAGE_PREFILL_EVAL": "layer"}, "--prefill-eval"),
    ],
)
def test_bad_schedule_settings_are_refused_at_startup_naming_the_flag(argv, env, flag, capsys):
    assert run_cli(argv, env=env)[0] == 2
    assert flag in capsys.readouterr().err


def test_schedule_settings_from_flags_and_env():
    args = cli.build_parser().parse_args(["serve", "--schedule", "fifo"])
    env = {"LINEAGE_SCHEDULE": "batched", "LINEAGE_PREFILL_BUDGET": "64"}
    c = config_from_args(args, env)
    assert (c.model.schedule, c.model.prefill_budget, c.model.prefill_group) == ("fifo", 64, 1)
    default = config_from_args(cli.build_parser().parse_args(["serve"]), {})
    assert default.model.schedule == "srpt"
    assert (default.model.prefill_step_factor, default.model.prefill_slice_ms) == (2.5, 50.0)
    args = cli.build_parser().parse_args(["serve", "--prefill-slice-ms", "25"])
    c = config_from_args(args, {"LINEAGE_PREFILL_STEP_FACTOR": "2"})
    assert (c.model.prefill_step_factor, c.model.prefill_slice_ms) == (2.0, 25.0)
    assert default.model.prefill_overlap and c.model.prefill_overlap
    args = cli.build_parser().parse_args(["serve", "--prefill-overlap", "off"])
    assert not config_from_args(args, {"LINEAGE_PREFILL_OVERLAP": "on"}).model.prefill_overlap
    assert not config_from_args(
        cli.build_parser().parse_args(["serve"]), {"LINEAGE_PREFILL_OVERLAP": "0"}
    ).model.prefill_overlap
    assert default.model.prefill_eval == "auto"
    args = cli.build_parser().parse_args(["serve", "--prefill-eval", "forward"])
    assert config_from_args(args, {"LINEAGE_PREFILL_EVAL": "module"}).model.prefill_eval == (
        "forward"
    )
    env = {"LINEAGE_PREFILL_EVAL": "module"}
    assert config_from_args(cli.build_parser().parse_args(["serve"]), env).model.prefill_eval == (
        "module"
    )


def test_parse_leaves_unset_serve_flags_none():
    args = cli.build_parser().parse_args(["serve"])
    flagged = [s.name for s in SETTINGS if s.flag is not None]
    assert len(flagged) > 50 and all(getattr(args, name) is None for name in flagged)


def test_serve_flags_land_in_engine_config(tmp_path):
    args = cli.build_parser().parse_args(
        [
            "serve",
            "--model",
            "/models/m",
            "--host",
            "0.0.0.0",
            "--port",
            "6000",
            "--cache-dir",
            str(tmp_path),
            "--cache-mode",
            "exact",
            "--ram-budget",
            "1G",
            "--disk-budget",
            "2G",
            "--address",
            "auto",
            "--http-port",
            "8080",
            "--prefill-step-size",
            "256",
            "--max-batch",
            "4",
        ]
    )
    c = config_from_args(args, {"LINEAGE_PORT": "7000", "LINEAGE_MAX_BATCH": "2"})
    assert (c.model.path, c.model.prefill_step_size, c.model.max_batch) == ("/models/m", 256, 4)
    assert (c.server.host, c.server.port, c.server.address, c.server.http_port) == (
        "0.0.0.0",
        6000,
        "auto",
        8080,
    )
    assert (c.cache.mode, c.cache.cache_dir, c.cache.ram_budget) == ("exact", str(tmp_path), GB)
    assert c.cache.disk_budget == min(2 * GB, shutil.disk_usage(tmp_path).free // 2)


def test_serve_env_applies_where_no_flag_is_given():
    args = cli.build_parser().parse_args(["serve", "--max-batch", "4"])
    c = config_from_args(
        args, {"LINEAGE_PORT": "7000", "LINEAGE_MAX_BATCH": "2", "APC_LINEAGE": "0"}
    )
    assert (c.server.port, c.model.max_batch, c.cache.mode) == (7000, 4, "exact")


@pytest.mark.parametrize(
    "argv,env,expected",
    [
        ([], {}, (1, 4096)),
        (["--replicas", "auto"], {"LINEAGE_ROUTE_THRESHOLD": "100"}, ("auto", 100)),
        ([], {"LINEAGE_REPLICAS": "3"}, (3, 4096)),
        (["--replicas", "2", "--route-threshold", "0"], {"LINEAGE_REPLICAS": "5"}, (2, 0)),
    ],
)
def test_replicas_and_route_threshold_from_flags_or_env(argv, env, expected):
    c = config_from_args(cli.build_parser().parse_args(["serve", *argv]), env)
    assert (c.server.replicas, c.server.route_threshold) == expected


@pytest.mark.parametrize("value", ["0", "many", "-2"])
def test_bad_replicas_are_value_errors(value):
    with pytest.raises(ValueError, match="replicas"):
        config_from_args(cli.build_parser().parse_args(["serve"]), {"LINEAGE_REPLICAS": value})


def test_stats_show_one_line_per_replica():
    replica = dict(
        replica=1, alive=False, entries=2, ram_bytes=2048, queued_prefill_tokens=300,
        in_flight=1, requests=7, restores={"anchor": 2}, handovers=1, handover_bytes=1024,
    )  # fmt: skip
    text = format_stats({"mode": "lineage", "replicas": [replica]})
    assert "replica 1" in text and "DOWN" in text and "anchor=2" in text
    assert "queued=300 tokens" in text and "handovers=1 (1.0 KiB)" in text


def test_serve_runs_the_engine_lifecycle_with_the_config(monkeypatch):
    import types

    import engine.server.running

    seen = []
    fake = types.ModuleType("engine.server.running.lifecycle")
    fake.run = lambda config, sidecars=(): seen.append(config) or 0
    fake.StartError = ValueError
    # `from engine.server.running import lifecycle` reads the package's attribute first,
    # which an earlier test's real serve has set: patched there too, or this test serves
    # for real on port 1234 and never returns.
    monkeypatch.setitem(sys.modules, "engine.server.running.lifecycle", fake)
    monkeypatch.setattr(engine.server.running, "lifecycle", fake, raising=False)
    assert run_cli(["serve", "--port", "1234", "--cache-mode", "off"])[0] == 0
    assert (seen[0].server.port, seen[0].cache.mode) == (1234, "off")


# ------------------------------------------------------------ cli, wire ----


def test_cli_generate_json_and_text(engine, tmp_path):
    hello = [{"role": "user", "content": "hello"}]
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps(hello))
    tools = tmp_path / "t.json"
    tools.write_text(json.dumps(fanout.make_tools(200)))
    code, out = run_cli(
        [
            "generate",
            "--messages",
            str(messages),
            "--tools",
            str(tools),
            "--max-tokens",
            "2",
            "--json",
            "--namespace",
            fresh_ns(),
            "--server",
            engine.address,
        ]
    )
    d = json.loads(out)
    assert code == 0 and 1 <= len(d["token_ids"]) <= 2
    assert d["usage"]["completion_tokens"] == len(d["token_ids"])
    with lc.Client(engine.address, timeout=60) as c:
        bare = c.generate(messages=hello, max_tokens=1, namespace=fresh_ns())
        expected = c.generate(prompt="x", max_tokens=2, namespace=fresh_ns())
    # the tools reached the server: the chat template rendered them into the prompt
    assert d["usage"]["prompt_tokens"] > bare.usage.prompt_tokens + 50
    code, out = run_cli(
        ["generate", "--prompt", "x", "--max-tokens", "2"], env={"LINEAGE_SERVER": engine.address}
    )
    assert (code, out) == (0, expected.text + "\n")


@pytest.mark.parametrize(
    "argv, code",
    [
        (["generate", "--messages", "/nonexistent.json"], 2),
        (["generate", "--prompt", "x", "--tools", "t.json"], 2),
        (["generate", "--prompt", "x", "--max-tokens", "0"], 2),
    ],
)
def test_cli_generate_usage_errors(engine, argv, code):
    assert run_cli(argv + ["--server", engine.address])[0] == code


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--messages", "wizard.json"], "role"),
        (["--prompt", "x", "--temperature=-1"], "temperature"),
    ],
)
def test_cli_generate_server_rejection_exits_1(engine, tmp_path, monkeypatch, capsys, argv, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wizard.json").write_text(json.dumps([{"role": "wizard", "content": "hi"}]))
    code, _ = run_cli(["generate", *argv, "--max-tokens", "2", "--server", engine.address])
    err = capsys.readouterr().err
    assert code == 1 and "INVALID_ARGUMENT" in err and needle in err.lower()


def test_cli_generate_unreachable_server_exits_1():
    assert run_cli(["generate", "--prompt", "x", "--server", f"127.0.0.1:{free_port()}"])[0] == 1


STATUS = re.compile(r"\[prompt (\d+) tok, cached (\d+).*?restore (\w+), ttft")


def test_cli_chat_resends_the_conversation(engine):
    ns = fresh_ns()
    code, out = run_cli(
        [
            "chat",
            "--system",
            "be brief",
            "--max-tokens",
            "2",
            "--namespace",
            ns,
            "--server",
            engine.address,
        ],
        stdin="hello\n\nagain\n/exit\nnever sent\n",
    )
    turns = [tuple(int(x) if x.isdigit() else x for x in m) for m in STATUS.findall(out)]
    assert code == 0 and len(turns) == 2 and out.count("[prompt ") == 2
    system = {"role": "system", "content": "be brief"}
    with lc.Client(engine.address, timeout=60) as c:
        one = c.generate(
            messages=[system, {"role": "user", "content": "hello"}],
            max_tokens=2,
            namespace=fresh_ns(),
        )
        two = c.generate(
            messages=[
                system,
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": one.text},
                {"role": "user", "content": "again"},
            ],
            max_tokens=2,
            namespace=fresh_ns(),
        )
    assert out.startswith(one.text + "\n[prompt ")
    # turn two re-sent system, user, the assistant's reply and the new user line
    assert (turns[0][0], turns[1][0]) == (one.usage.prompt_tokens, two.usage.prompt_tokens)
    assert turns[0][1:] == (0, "none")
    _, cached, kind = turns[1]
    assert cached >= one.usage.prompt_tokens and kind != "none"


def test_chat_drops_a_failed_turn_and_stops_when_unavailable():
    chat = Chat("sys")
    out, err = io.StringIO(), io.StringIO()
    with lc.Client(f"127.0.0.1:{free_port()}") as down:
        assert run_chat(down, chat, {"max_tokens": 2}, io.StringIO("hi\nnever\n"), out, err) == 1
    assert chat.messages == [{"role": "system", "content": "sys"}]
    assert "UNAVAILABLE" in err.getvalue()


def test_cli_fanout_and_stats(engine, tmp_path):
    path = tmp_path / "rows.json"
    code, out = run_cli(
        [
            "fanout",
            "--agents",
            "2",
            "--turns",
            "2",
            "--system-tokens",
            "300",
            "--max-tokens",
            "2",
            "--namespace",
            fresh_ns(),
            "--json",
            str(path),
            "--server",
            engine.address,
        ]
    )
    data = json.loads(path.read_text())
    assert code == 0 and [(r["agent"], r["turn"]) for r in data["rows"]] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert all(
        r["cached_tokens"] > 0 and r["restore_kind"] != "none"
        for r in data["rows"]
        if r["turn"] == 1
    )
    assert data["summary"]["cached_tokens"] > 0 and "total:" in out
    code, out = run_cli(["stats", "--json", "--server", engine.address])
    stats = json.loads(out)
    assert code == 0 and stats["mode"] == "lineage" and stats["entries"] >= 1
    code, out = run_cli(["stats", "--server", engine.address])
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert code == 0 and lines["mode"] == "lineage"
    assert re.fullmatch(r"[\d.]+ (B|KiB|MiB|GiB) \(\d+\)", lines["ram_bytes"])
    assert re.fullmatch(r"\d+\.\d%", lines["cached_fraction"])


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
    # One "mlx" per node, and a resource that places a model (--model NAME=PATH,resource=R).
    for key, model in (("head_start_ray_commands", "big"), ("worker_start_ray_commands", "small")):
        commands = config[key]
        assert "ray stop" in commands[0]
        start = commands[-1]
        assert f"""--resources='{{"mlx": 1, "{model}_model": 1}}'""" in start
        assert f",resource={model}_model " in (ROOT / "cluster.yaml").read_text()
        assert "export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1" in start
        assert "RAY_AUTH_MODE=token" in start  # Ray's token auth on every node
    assert "~/.ray/auth_token" in config["file_mounts"]


def test_cluster_yaml_passes_rays_schema():
    pytest.importorskip("ray.autoscaler")
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(yaml.safe_load((ROOT / "cluster.yaml").read_text())))


def test_disk_budget_counts_the_caches_own_files_as_available(tmp_path, monkeypatch):
    """At a restart the cache's own files are part of what it may use, not lost free space."""
    import collections

    from engine.config import EngineConfig

    entries = tmp_path / "entries"
    entries.mkdir()
    (entries / "7.entry").write_bytes(b"x" * 6000)
    (entries / "8.entry").write_bytes(b"x" * 4000)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "weights.safetensors").write_bytes(b"w" * 50000)  # not the cache's
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr("shutil.disk_usage", lambda path: usage(10**9, 0, 10000))
    c = EngineConfig.from_sources({"cache_dir": str(tmp_path)}, {})
    assert c.cache.disk_budget == (10000 + 10000) // 2


def test_plot_without_matplotlib_is_one_line_naming_the_extra(monkeypatch, capsys):
    import argparse
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    ran = []
    args = argparse.Namespace(bench="agents", plot="x.png")
    assert bench.launch(args, ran.append) == 1
    assert ran == []
    assert "--plot needs matplotlib" in capsys.readouterr().out
    args.plot = None
    assert bench.launch(args, ran.append) == 0 and len(ran) == 1


def test_a_reader_that_stops_early_ends_generate_quietly(engine):
    """`lineage generate ... | head -1`: the pipe closes mid-stream; the command exits 141
    (a shell's SIGPIPE status) without a traceback."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "clients.cli", "generate", "--server", engine.address]
    argv += ["--prompt", "import os\nimport sys\n", "--max-tokens", "400", "--temperature", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)  # the stream has begun
    proc.stdout.close()  # the reader goes away
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err
    assert "Traceback" not in err, err
