"""The input limits are operator settings: one `Limits` in the configuration
tree, a flag and a variable each, the defaults as before, nonsense refused at startup,
and what the operator set is what the server applies (gRPC and the bridge)."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from engine.config import EngineConfig, Limits
from engine.server.security.limits import DEFAULT_LIMITS
from tests.clients.test_cli import run_cli
from tests.server.test_server import PROMPTS, collect, request


def test_the_defaults_are_the_old_constants():
    assert Limits() == DEFAULT_LIMITS == EngineConfig.from_sources({}, {}).limits
    assert (Limits().max_stop_strings, Limits().max_request_bytes) == (16, 4 << 20)
    # The body cap is the request cap: the bridge never parses what the engine refuses.
    assert (Limits().max_body_bytes, Limits().max_memo_bytes) == (4 << 20, 32 << 20)


def test_every_limit_comes_from_its_flag_or_its_variable():
    flags = {"max_stop_strings": 4, "max_tools_bytes": "1M"}
    env = {
        "LINEAGE_MAX_STOP_STRINGS": "99",  # the flag wins
        "LINEAGE_MAX_JSON_DEPTH": "8",
        "LINEAGE_MAX_BODY_BYTES": "2M",
        "LINEAGE_MAX_ID_LENGTH": "40",
    }
    limits = EngineConfig.from_sources(flags, env).limits
    assert (limits.max_stop_strings, limits.max_tools_bytes) == (4, 1 << 20)
    assert (limits.max_json_depth, limits.max_body_bytes, limits.max_id_length) == (8, 2 << 20, 40)
    for f in dataclasses.fields(Limits):  # every one has its flag and its variable
        name = f.name.upper()
        assert EngineConfig.from_sources({f.name: 7}, {}).limits == dataclasses.replace(
            Limits(), **{f.name: 7}
        )
        assert getattr(EngineConfig.from_sources({}, {"LINEAGE_" + name: "9"}).limits, f.name) == 9


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"max_stop_strings": 0}, "--max-stop-strings"),
        ({"max_messages": -1}, "--max-messages"),
        ({"max_id_length": True}, "--max-id-length"),
        ({"max_json_depth": 100_000}, "--max-json-depth"),
        ({"max_request_bytes": 4 << 30}, "--max-request-bytes"),
    ],
)
def test_a_nonsensical_limit_is_a_value_error_naming_its_flag(change, needle):
    with pytest.raises(ValueError, match=needle):
        Limits(**change)


@pytest.mark.parametrize(
    "argv, env, needle",
    [
        (["--max-stop-strings", "0"], {}, "--max-stop-strings"),
        (["--max-messages", "-1"], {}, "--max-messages"),
        ([], {"LINEAGE_MAX_JSON_DEPTH": "100000"}, "--max-json-depth"),
        ([], {"LINEAGE_MAX_JSON_DEPTH": "deep"}, "--max-json-depth"),
        (["--max-request-bytes", "4G"], {}, "--max-request-bytes"),
        ([], {"LINEAGE_MAX_TOOLS_BYTES": "lots"}, "--max-tools-bytes"),
        (["--disk-queue-limit", "0"], {}, "--disk-queue-limit"),
    ],
)
def test_nonsensical_limits_are_refused_at_startup(argv, env, needle, capsys):
    assert run_cli(["serve", *argv], env=env)[0] == 2  # before Ray or a model starts
    assert needle in capsys.readouterr().err


def test_the_serve_and_bridge_commands_take_the_limit_flags():
    from clients.cli import main as cli
    from clients.cli.args import config_from_args

    args = cli.build_parser().parse_args(
        ["serve", "--max-stop-length", "64", "--max-body-bytes", "1M"]
    )
    limits = config_from_args(args, {}).limits
    assert (limits.max_stop_length, limits.max_body_bytes) == (64, 1 << 20)
    args = cli.build_parser().parse_args(["bridge", "--max-body-bytes", "1K"])
    assert args.max_body_bytes == 1024


def test_the_limits_set_are_the_limits_applied_over_grpc(engine, stub):
    frontend = engine.engine.frontend
    saved = frontend.limits
    frontend.limits = Limits(max_stop_strings=1, max_id_length=8, max_request_bytes=2000)
    try:
        cases = [
            (request(prompt_ids=PROMPTS[0], max_tokens=2, stop=["a", "b"]), "the limit is 1"),
            (_with_id(request(prompt_ids=PROMPTS[0], max_tokens=2), "x" * 9), "the limit is 8"),
            (request(prompt_ids=list(range(200, 1400)), max_tokens=2), "the limit is 2000"),
        ]
        for req, needle in cases:
            with pytest.raises(grpc.RpcError) as err:
                collect(stub, req)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert needle in err.value.details()
        ids, _, _ = collect(stub, _with_id(request(prompt_ids=PROMPTS[0], max_tokens=2), "ok-8"))
        assert ids
    finally:
        frontend.limits = saved
    ids, _, _ = collect(stub, request(prompt_ids=PROMPTS[0], max_tokens=2, stop=["a", "b"]))
    assert ids


def _with_id(req, request_id: str):
    req.request_id = request_id
    return req


def test_the_bridge_applies_its_body_limit():
    import httpx

    from clients.bridge.server import bridge_security, start_bridge
    from engine.config import ServerConfig
    from engine.server.running.background import BackgroundLoop

    loop = BackgroundLoop("bridge-body")
    security = bridge_security(ServerConfig(), Limits(max_body_bytes=1000))
    handle = loop.call(start_bridge("127.0.0.1:1", "127.0.0.1", 0, security))  # no engine
    try:
        with httpx.Client(timeout=10) as http:
            r = http.post(f"{handle.url}/v1/completions", content=b" " * 1001)
            assert r.status_code == 413
            r = http.post(f"{handle.url}/v1/completions", content=b"{}")
            assert r.status_code != 413
    finally:
        loop.call(handle.stop(grace=0.5))
        loop.close()
