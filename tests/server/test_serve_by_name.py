"""`lineage serve --model org/name` against a hub of our own on 127.0.0.1 (tests/hub.py).

Real `lineage serve` processes: the first start downloads the model into the
Hugging Face cache (its progress in the output) and answers a request; the next
start, with the hub gone and HF_HUB_OFFLINE set, serves it from the cache; two
models of a fleet are given by name and each answers. The failures are in
tests/clients/test_models_by_name.py.
"""

from __future__ import annotations

import os
import re

import pytest

from clients.cli.main import main
from clients.client import Client
from tests.hub import Hub, start_hub
from tests.serve_process import SERVING, start_serve, stop

pytestmark = pytest.mark.ray


@pytest.fixture
def local_hub(random_model_dir, tmp_path, monkeypatch):
    """The tiny model as org/tiny; the variables that point `lineage serve` at the hub and
    at an empty cache of this test's own (its children inherit them)."""
    server, h = start_hub(Hub())
    h.add_dir("org/tiny", random_model_dir)
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield server, h
    server.shutdown()
    server.server_close()


def _address(log) -> str:
    port = re.search(r"lineage: serving .* on [^ ]+:(\d+),", log.read_text()).group(1)
    return f"127.0.0.1:{port}"


def test_a_first_start_downloads_and_serves_and_the_next_is_offline(
    local_hub, tmp_path, monkeypatch
):
    server, h = local_hub
    work = tmp_path / "first"
    work.mkdir()
    serve, log = start_serve(tmp_path / "cache", work, "--model", "org/tiny", ready=(SERVING,))
    try:
        text = log.read_text()
        assert "lineage: downloading org/tiny: 0 B of " in text
        assert re.search(r"lineage: org/tiny: ([\d.]+ \w+) of \1, ", text), text
        assert f"({tmp_path / 'hf'}/models--org--tiny/snapshots/{'a' * 40})" in text
        with Client(_address(log)) as client:
            assert client.generate(prompt="hello", max_tokens=3).usage.completion_tokens == 3
    finally:
        stop(serve)
    assert serve.returncode == 0, log.read_text()[-2000:]

    server.shutdown()  # no hub any more
    h.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    work = tmp_path / "second"
    work.mkdir()
    serve, log = start_serve(tmp_path / "cache", work, "--model", "org/tiny", ready=(SERVING,))
    try:
        assert "downloading" not in log.read_text()
        with Client(_address(log)) as client:
            assert client.generate(prompt="hello", max_tokens=3).usage.completion_tokens == 3
    finally:
        stop(serve)
    assert h.requests == []


def test_two_fleet_models_by_name(local_hub, tmp_path, capsys):
    from engine.runtime.model.tiny_models import write_model_dir

    server, h = local_hub
    h.add_dir("org/other", write_model_dir("qwen3_next", tmp_path / "other", seed=7), "b" * 40)
    flags = ("--model", "one=org/tiny", "--model", "two=org/other")
    serve, log = start_serve(tmp_path / "cache", tmp_path, *flags, ready=(SERVING,))
    try:
        assert "lineage: downloading org/tiny" in log.read_text()
        assert "lineage: downloading org/other" in log.read_text()
        with Client(_address(log)) as client:
            for name in ("one", "two"):
                reply = client.generate(prompt="hello", max_tokens=2, model=name)
                assert reply.usage.completion_tokens == 2
            served = {m["name"]: m["model"] for m in client.model_info()["models"]}
        assert served == {"one": "a" * 40, "two": "b" * 40}  # each its snapshot
        # `lineage models` marks both served
        assert main(["models", "--server", _address(log)], dict(os.environ)) == 0
        rows = [re.split(r"\s{2,}", line) for line in capsys.readouterr().out.splitlines()]
        assert [(r[0], r[-1]) for r in rows[1:]] == [("org/other", "yes"), ("org/tiny", "yes")]
    finally:
        stop(serve)
