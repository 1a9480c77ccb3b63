"""Session-wide fixtures: one Ray instance, real engines served on localhost ports.

`engine` serves the embedded default (trained) model: tests compare its greedy output
with a speculating engine's, or need a reply that ends or runs on. `random_engine` and
the tenants' engine (`secured`) serve the random-weight qwen3_next (`random_model_dir`):
their tests need a hybrid model, not the trained one's predictions, and its prefill is
~1.7x faster on a CPU.

An engine runs its grpc.aio server on an event loop in a background thread, so
the tests talk to it with ordinary (sync) gRPC clients, as users do.
"""

from __future__ import annotations

import os

import pytest

from engine.config import Identity
from engine.server.running.background import BackgroundEngine
from tests.engines import make_config

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def pytest_collection_modifyitems(items):
    """Mark every test that needs the session's Ray instance `ray` (`-m "not ray"` skips them)."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def metrics_port():
    """The port of the session Ray's Prometheus export (ray_session)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_session(metrics_port):
    import ray

    # The dashboard (on a free port) serves the state API: ray.util.state.list_actors,
    # actor logs. Metrics are reported every second, exported at metrics_port.
    # address="local": always a Ray of our own, never one another process on the
    # machine already runs (num_cpus cannot be given to a cluster we attach to).
    ctx = ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=0,
        configure_logging=False,
        log_to_driver=False,
        namespace="lineage-tests",
        _metrics_export_port=metrics_port,
        _system_config={"metrics_report_interval_ms": 1000},
    )
    ray.dashboard_address = f"http://{ctx.dashboard_url}"  # for ray.util.state calls
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory):
    """Where the embedded default model is built, once per session."""
    return tmp_path_factory.mktemp("lineage-cache")


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory):
    """A random-weight qwen3_next (hidden 64), built once per session: for the tests that
    need *a* hybrid model but not the trained one's predictions (its prefill is ~1.7x
    faster on a CPU than the embedded model's)."""
    from engine.runtime.model.tiny_models import write_model_dir

    return write_model_dir("qwen3_next", tmp_path_factory.mktemp("random-qwen3_next"))


@pytest.fixture(scope="session")
def engine(ray_session, model_cache_dir):
    """The embedded default model in lineage mode, shared by the session."""
    e = BackgroundEngine(make_config(model_cache_dir))
    yield e
    e.stop()


@pytest.fixture(scope="session")
def random_engine(ray_session, tmp_path_factory, random_model_dir):
    """The random-weight qwen3_next in lineage mode, shared by the session: for the tests of
    caching and constrained output, whose replies are compared with each other only."""
    e = BackgroundEngine(make_config(tmp_path_factory.mktemp("random"), model=random_model_dir))
    yield e
    e.stop()


@pytest.fixture(scope="session")
def stub(engine):
    import grpc

    from engine.proto import engine_pb2_grpc

    channel = grpc.insecure_channel(engine.address)
    yield engine_pb2_grpc.EngineStub(channel)
    channel.close()


# The tenants' engine: tokens (an operator, alice, bob), TLS, rounded cache figures,
# and a Unix socket for bridges (no TLS there; tokens still apply). Shared by the
# tests of tenants, the bridge's identity and the figures a probe sees.
TENANT_TOKENS = (
    Identity("op-token", "", admin=True),
    Identity("alice-token", "alice"),
    Identity("bob-token", "bob"),
)


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    from tests.certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def secured(ray_session, tmp_path_factory, certs, random_model_dir):
    import tempfile

    config = make_config(tmp_path_factory.mktemp("tenants"), model=random_model_dir)
    config = config.with_server(
        tokens=TENANT_TOKENS,
        tls_cert=certs.server_cert,
        tls_key=certs.server_key,
        exact_cache_figures=False,
    )
    private = tempfile.mkdtemp(prefix="lineage-test-")
    socket = os.path.join(private, "grpc.sock")
    engine = BackgroundEngine(config, local_socket=socket)
    engine.socket = socket
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def shared_serve(tmp_path_factory):
    from tests.serve_process import SharedServe

    holder = SharedServe(tmp_path_factory.mktemp("serve-cache"), tmp_path_factory.mktemp("serve"))
    yield holder
    holder.close()


@pytest.fixture
def served(shared_serve):
    """One real `lineage serve --http-port --metrics-port` in a session of its own, shared
    by the tests that only need it running (its sockets, its metrics); the SIGINT case of
    tests/server/test_serve_stop.py stops it, and a later test gets a fresh one."""
    return shared_serve.current()
