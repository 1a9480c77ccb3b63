"""Authentication, TLS and exposure, on a real gRPC server.

The server here has no engine behind it: the token check, TLS, mTLS and
reflection all act before the servicer, so a refused call never reaches it
and health answers without one. The end-to-end round trips (Python client and
`openai` client over TLS, a tenant probe) are in test_tenants.py.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients.client import Client, LineageError
from engine.config import EngineConfig, Identity, Limits, ServerConfig, read_token_file
from engine.server.rpc.service import create_server
from engine.server.running.background import BackgroundLoop
from engine.server.security.auth import Authenticator
from tests.certs import make_certs

TOKENS = (Identity("op-token", "", admin=True), Identity("alice-token", "alice"))


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@contextlib.contextmanager
def serving(**security):
    """A started gRPC server (no engine) on a free loopback port; yields its address."""
    loop = BackgroundLoop("auth-test")
    info = SimpleNamespace(
        path="/secret/models/m",
        model_type="t",
        vocab_size=10,
        max_context=100,
        fingerprint="f",
        has_state_layers=False,
        kernels=(),
    )
    frontend = SimpleNamespace(
        info=info,
        cache_mode="lineage",
        limits=Limits(),
        builder=SimpleNamespace(output_format="qwen"),
    )
    cfg = ServerConfig(**security)
    server, port, _ = loop.call(create_server(frontend, "127.0.0.1", 0, security=cfg))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        loop.call(server.stop(0))
        loop.close()


def health(channel) -> str:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_calls_without_a_valid_token_are_unauthenticated_and_health_stays_open():
    with serving(tokens=TOKENS) as address:
        for token in (None, "wrong", "op-tokenx", "alice"):
            with Client(address, auth_token=token) as c:
                with pytest.raises(LineageError) as err:
                    c.model_info()
                assert err.value.code == "UNAUTHENTICATED"
                with pytest.raises(LineageError) as err:
                    c.generate(prompt="hi", max_tokens=1)
                assert err.value.code == "UNAUTHENTICATED"
        with grpc.insecure_channel(address) as channel:
            assert health(channel) == "SERVING"
        with Client(address, auth_token="alice-token") as c:
            info = c.model_info()  # a known token passes; no directory leaks
        assert info["model"] == "m"


def test_tls_round_trip_and_a_client_that_does_not_trust_the_server(certs):
    with serving(tls_cert=certs.server_cert, tls_key=certs.server_key) as address:
        with Client(address, tls_ca=certs.ca) as c:
            assert c.model_info()["model"] == "m"
        with Client(address, tls_ca=certs.other_ca, timeout=5) as c:
            with pytest.raises(LineageError) as err:
                c.model_info()
            assert err.value.code == "UNAVAILABLE"
        with Client(address, timeout=5) as c:  # plain text to a TLS port
            with pytest.raises(LineageError):
                c.model_info()


def test_mtls_needs_a_client_certificate_signed_by_the_client_ca(certs):
    cfg = dict(tls_cert=certs.server_cert, tls_key=certs.server_key, tls_client_ca=certs.ca)
    with serving(**cfg) as address:
        with Client(address, tls_ca=certs.ca, timeout=5) as c:
            with pytest.raises(LineageError):
                c.model_info()
        with Client(
            address, tls_ca=certs.ca, tls_cert=certs.client_cert, tls_key=certs.client_key
        ) as c:
            assert c.model_info()["model"] == "m"


def _reflection_names(address: str) -> list[str]:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        try:
            (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        except grpc.RpcError as e:
            return [e.code().name]
    return [s.name for s in reply.list_services_response.service]


def test_reflection_is_on_loopback_only_unless_asked():
    with serving() as address:  # loopback: on
        assert "lineage.v1.Engine" in _reflection_names(address)
    with serving(host="0.0.0.0", insecure=True) as address:  # not loopback: off
        assert _reflection_names(address) == ["UNIMPLEMENTED"]
    with serving(host="0.0.0.0", insecure=True, reflection=True) as address:
        assert "lineage.v1.Engine" in _reflection_names(address)


@pytest.mark.parametrize(
    "host,tokens,insecure,ok",
    [
        ("127.0.0.1", (), False, True),
        ("::1", (), False, True),
        ("localhost", (), False, True),
        ("0.0.0.0", (), False, False),
        ("192.168.1.5", (), False, False),
        ("0.0.0.0", TOKENS, False, True),
        ("0.0.0.0", (), True, True),
    ],
)
def test_a_non_loopback_bind_needs_a_token_or_insecure(host, tokens, insecure, ok):
    cfg = ServerConfig(host=host, tokens=tokens, insecure=insecure)
    if ok:
        cfg.check_exposure()
    else:
        with pytest.raises(ValueError, match="--auth-token"):
            cfg.check_exposure()


def test_tokens_come_from_the_flag_the_environment_and_a_file(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("# operator\nop-token\nalice-token alice\nbob-token bob admin\n")
    assert read_token_file(str(f)) == (
        Identity("op-token", "", True),
        Identity("alice-token", "alice", False),
        Identity("bob-token", "bob", True),
    )
    env = {"LINEAGE_AUTH_TOKEN": "env-token", "LINEAGE_AUTH_TOKEN_FILE": str(f)}
    server = EngineConfig.from_sources({}, env).server
    assert [i.token for i in server.tokens] == ["env-token", "op-token", "alice-token", "bob-token"]
    server = EngineConfig.from_sources({"auth_token": "flag"}, env).server
    assert server.tokens[0] == Identity("flag", "", True)
    assert "flag" not in repr(server.tokens[0])  # never in a log line
    assert not server.exact_cache_figures  # `lineage serve` rounds unless asked
    env["LINEAGE_EXACT_CACHE_FIGURES"] = "1"
    assert EngineConfig.from_sources({}, env).server.exact_cache_figures
    f.write_text("a b c d\n")
    with pytest.raises(ValueError, match="TOKEN"):
        read_token_file(str(f))


def test_a_tenants_namespace_comes_from_its_token():
    auth = Authenticator(TOKENS)
    alice, op = auth.identity([("authorization", "Bearer alice-token")]), TOKENS[0]
    assert auth.namespace(alice, "") == "alice"
    assert auth.namespace(alice, "bob") == "alice/bob"  # never bob's own
    assert auth.namespace(alice, "alice") == "alice"
    assert auth.namespace(op, "bob") == "bob"  # an admin names any namespace
    assert Authenticator().namespace(None, "x") == "x"  # auth off: the request's


def test_cache_stats_needs_an_admin_token():
    with serving(tokens=TOKENS) as address:
        with Client(address, auth_token="alice-token") as c:
            with pytest.raises(LineageError) as err:
                c.cache_stats()
            assert err.value.code == "PERMISSION_DENIED"


def test_the_cli_sends_the_token_from_its_flag_or_environment(capsys):
    from clients.cli.main import main

    with serving(tokens=TOKENS) as address:
        assert main(["stats", "--server", address], env={}) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        env = {"LINEAGE_AUTH_TOKEN": "alice-token"}
        assert main(["stats", "--server", address], env=env) == 1
        assert "PERMISSION_DENIED" in capsys.readouterr().err  # authenticated, not admin
        assert main(["stats", "--server", address, "--auth-token", "wrong"], env=env) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_serve_refuses_a_public_bind_without_a_token(capsys):
    from clients.cli.main import main

    assert main(["serve", "--host", "0.0.0.0", "--port", "0"], env={}) == 2
    assert "--insecure" in capsys.readouterr().err


def test_the_bridge_serves_mtls_and_checks_tokens_before_anything(certs):
    import httpx

    from clients.bridge.guard import BridgeSecurity
    from clients.bridge.server import start_bridge

    loop = BackgroundLoop("bridge-mtls")
    security = BridgeSecurity(
        (Identity("op-token", "", True),),
        certs.server_cert,
        certs.server_key,
        tls_client_ca=certs.ca,
    )
    handle = loop.call(start_bridge("127.0.0.1:1", "127.0.0.1", 0, security))  # no engine
    try:
        assert handle.url.startswith("https://")
        with httpx.Client(verify=certs.ca, timeout=10) as anonymous:
            with pytest.raises(httpx.HTTPError):  # the handshake wants a client certificate
                anonymous.get(f"{handle.url}/v1/models")
        import ssl

        mine = ssl.create_default_context(cafile=certs.ca)
        mine.load_cert_chain(certs.client_cert, certs.client_key)
        with httpx.Client(verify=mine, timeout=10) as http:
            r = http.get(f"{handle.url}/v1/models")
            assert r.status_code == 401 and r.json()["error"]["type"] == "auth_error"
            r = http.post(
                f"{handle.url}/v1/completions",
                headers={"authorization": "Bearer op-token"},
                content=b" " * (security.max_body_bytes + 1),
            )
            assert r.status_code == 413
    finally:
        loop.call(handle.stop(grace=0.5))
        loop.close()


@pytest.mark.parametrize(
    "lines",
    [["t1 acme", "t2 acme/dev"], ["t2 acme/dev", "t1 acme"], ["t1 a/b", "t2 a/b/c"]],
    ids=["parent first", "child first", "deeper"],
)
def test_tenant_namespaces_that_nest_are_refused_at_start(tmp_path, lines, capsys):
    """With `acme` and `acme/dev`, acme asking for `dev` would run in acme/dev's namespace."""
    from clients.cli.main import main

    f = tmp_path / "tokens"
    f.write_text("op-token\n" + "\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="nest"):
        EngineConfig.from_sources({"auth_token_file": str(f)}, {})
    assert main(["serve", "--auth-token-file", str(f), "--port", "0"], env={}) == 2
    assert "nest" in capsys.readouterr().err
    f.write_text("op-token\nt1 acme\nt2 acme\nt3 acme-dev\n")  # two tokens of one tenant: fine
    assert len(read_token_file(str(f))) == 4
