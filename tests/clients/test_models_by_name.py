"""Models by their Hugging Face name, against a hub of our own on 127.0.0.1 (tests/hub.py).

`lineage pull`, `lineage models` and every failure of a model by name: each
failure is one line on stderr, naming what to do, with its exit status, and
`lineage serve`'s come before Ray or MLX is imported (the serve cases run in
an interpreter where importing either raises). The hub serves the tiny
random-weight model directory the tests build (tests/conftest.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clients.cli.main import main
from engine import hub
from engine.hub import fetch
from tests.hub import Hub, start_hub

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local_hub(random_model_dir, tmp_path):
    """(hub, env): the tiny model as org/tiny, and the variables that point at the hub and at
    an empty cache of this test's own."""
    server, h = start_hub(Hub())
    h.add_dir("org/tiny", random_model_dir)
    env = {"HF_ENDPOINT": h.url, "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
    yield h, env
    server.shutdown()
    server.server_close()


def _settings(env) -> hub.HubSettings:
    return hub.HubSettings.from_env(env)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _serve_without_ray(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """`lineage serve --port 0 argv` where importing Ray or MLX (mlx-lm's modules too)
    raises ImportError; mlx-lm's files stay readable (which architectures it has)."""
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('mlx', 'ray') or name.startswith('mlx_lm.'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from clients.cli.main import main\n"
        f"sys.exit(main({json.dumps(['serve', '--port', '0', *argv])}, env={env!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_pull_fetches_only_the_model_files_and_models_lists_it(local_hub, tmp_path, capsys):
    h, env = local_hub
    h.repos["org/tiny"].files["README.md"] = b"# tiny"
    h.repos["org/tiny"].files["pytorch_model.bin"] = b"\0" * 1000
    assert main(["pull", "org/tiny"], env) == 0
    fetched = {p for _, p, _ in h.requests if "/resolve/" in p}
    assert {p.rsplit("/", 1)[1] for p in fetched} == {
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    capsys.readouterr()
    assert main(["models", "--server", "127.0.0.1:9"], env) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["MODEL", "REVISION", "SIZE", "ARCHITECTURE", "HYBRID", "SERVED"]
    (row,) = out[1:]
    size = sum(len(d) for n, d in h.repos["org/tiny"].files.items() if n.endswith(("json", "s")))
    (cached,) = hub.cached_models(_settings(env))
    assert cached.size == size
    from engine.config import format_bytes

    cells = re.split(r"\s{2,}", row)
    assert cells == ["org/tiny", "main," + "a" * 12, format_bytes(size), "qwen3_next", "yes"]
    assert main(["models", "rm", "org/tiny"], env) == 0
    assert hub.cached_models(_settings(env)) == []


def test_progress_goes_to_the_terminal_and_the_log(local_hub, capsys, caplog):
    import logging

    h, env = local_hub
    with caplog.at_level(logging.INFO, logger="lineage.hub"):
        assert main(["pull", "org/tiny"], env) == 0
    err = capsys.readouterr().err
    assert "lineage: downloading org/tiny: 0 B of " in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("lineage: org/tiny: ") and "/s" in last
    done, total = last.split(": ")[2].split(",")[0].split(" of ")
    assert done == total  # every byte counted
    assert any("downloading org/tiny" in r.getMessage() for r in caplog.records)


def test_a_cut_download_fails_in_one_line_and_the_next_resumes_it(local_hub, monkeypatch, capsys):
    from huggingface_hub import constants

    h, env = local_hub
    # huggingface_hub writes what it reads in chunks of 10 MiB, more than the tiny model's
    # weights: smaller ones, so that the half sent before the cut reaches the file.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 << 10)
    h.cut.add("org/tiny/model.safetensors")
    assert main(["pull", "org/tiny"], env) == 1
    err = capsys.readouterr().err.splitlines()
    assert [e for e in err if not e.startswith("lineage: ")] == [err[-1]]  # one line
    line = err[-1]
    assert line.startswith("lineage pull: error: the download of org/tiny from")
    assert line.endswith("was interrupted (RemoteProtocolError): run again to resume it")
    settings = _settings(env)
    folder = fetch.repo_folder(settings, hub.parse_ref("org/tiny"))
    assert not (folder / "snapshots" / ("a" * 40) / "model.safetensors").exists()
    (partial,) = (folder / "blobs").glob("*.incomplete")
    weights = h.repos["org/tiny"].files["model.safetensors"]
    kept = partial.stat().st_size
    assert 0 < kept <= len(weights) // 2
    # offline, the partial download is no model: never loaded, by name or by its commit
    # (whose snapshot folder exists, holding the files that did arrive)
    assert (folder / "snapshots" / ("a" * 40) / "config.json").is_file()
    offline = hub.HubSettings.from_env({**env, "HF_HUB_OFFLINE": "1"})
    for ref in ("org/tiny", "org/tiny@" + "a" * 40):
        with pytest.raises(hub.HubError, match="is not in the Hugging Face cache"):
            hub.resolve(ref, offline)
    h.cut.clear()
    h.requests.clear()
    path = hub.resolve("org/tiny", settings)
    assert (path / "model.safetensors").read_bytes() == weights
    gets = [r for m, p, r in h.requests if m == "GET" and p.endswith("model.safetensors")]
    assert gets == [f"bytes={kept}-"]  # resumed where it broke


def test_not_enough_disk_is_refused_before_a_byte_is_fetched(local_hub, monkeypatch, capsys):
    h, env = local_hub
    monkeypatch.setattr(fetch, "free_bytes", lambda path: 1_000_000)
    assert main(["pull", "org/tiny"], env) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("lineage pull: error: org/tiny needs 2.8 MiB and ")
    assert line.endswith("has 976.6 KiB free: make room, or set HF_HUB_CACHE to a larger disk")
    assert not [p for _, p, _ in h.requests if "/resolve/" in p]


def test_a_new_revision_keys_a_new_cache_and_the_same_one_the_same(local_hub, tmp_path):
    from engine.runtime.model.fingerprint import model_fingerprint
    from engine.runtime.model.tiny_models import write_model_dir

    h, env = local_hub
    settings = _settings(env)
    first = hub.resolve("org/tiny", settings)
    print_a = model_fingerprint(first, "float32")
    assert model_fingerprint(hub.resolve("org/tiny", settings), "float32") == print_a
    other = write_model_dir("qwen3_next", tmp_path / "other", seed=7)
    h.add_dir("org/tiny", other, sha="b" * 40)
    second = hub.resolve("org/tiny", settings, refresh=True)  # as `lineage pull` asks
    assert second.name == "b" * 40
    assert model_fingerprint(second, "float32") != print_a
    assert hub.resolve("org/tiny", settings) == second  # main moved: the next start takes it
    assert hub.resolve("org/tiny@" + "a" * 40, settings) == first


@pytest.mark.parametrize(
    "setup, model, env_extra, status, line",
    [
        (
            None,
            "org/tiny",
            {"HF_HUB_OFFLINE": "1"},
            2,
            "{flag}: org/tiny is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE "
            "is set: unset it, or `lineage pull` it where the Hub is reachable",
        ),
        (
            "gated",
            "org/gated",
            {},
            2,
            "{flag}: org/gated is gated on {url}: accept its terms there, then set HF_TOKEN "
            "to a token of that account",
        ),
        (
            "gated",
            "org/gated",
            {"HF_TOKEN": "wrong"},
            2,
            "{flag}: org/gated is gated on {url}: accept its terms there, then HF_TOKEN's "
            "account has no access yet",
        ),
        (
            "private",
            "org/private",
            {},
            2,
            "{flag}: org/private on {url} does not exist, or is private or gated: set HF_TOKEN "
            "to a token that can",
        ),
        (
            None,
            "org/missing",
            {},
            2,
            "{flag}: org/missing: no such repository on {url} (check the name)",
        ),
        (
            None,
            "org/tiny@v9",
            {},
            2,
            "{flag}: org/tiny@v9: no revision 'v9' in org/tiny on {url}",
        ),
        (
            "torch",
            "org/torch",
            {},
            2,
            "{flag}: org/torch holds PyTorch weights only: convert it first, "
            "`mlx_lm.convert --hf-path org/torch --mlx-path DIR`, and serve DIR",
        ),
        (
            "alien",
            "org/alien",
            {},
            2,
            "{flag}: org/alien is a no_such_arch, an architecture mlx-lm does not have "
            "(upgrade mlx-lm, or pick another model)",
        ),
        (
            None,
            "a=org/missing",
            {},
            2,
            "{flag} a=: org/missing: no such repository on {url} (check the name)",
        ),
    ],
)
def test_serve_refuses_a_model_it_cannot_have_in_one_line_before_ray(
    local_hub, random_model_dir, tmp_path, setup, model, env_extra, status, line
):
    h, env = local_hub
    files = {p.name: p.read_bytes() for p in random_model_dir.iterdir()}
    if setup == "gated":
        h.add_dir("org/gated", random_model_dir, gated_token="right")
    elif setup == "private":
        h.add_dir("org/private", random_model_dir, gated_token="right", denied="")
    elif setup == "torch":
        h.repos["org/torch"] = type(h.repos["org/tiny"])(
            {"config.json": files["config.json"], "pytorch_model.bin": b"\0" * 64}
        )
    elif setup == "alien":
        config = json.loads(files["config.json"])
        config["model_type"] = "no_such_arch"
        h.repos["org/alien"] = type(h.repos["org/tiny"])(
            {**files, "config.json": json.dumps(config).encode()}
        )
    done = _serve_without_ray(["--model", model], {**env, **env_extra})
    assert done.returncode == status, done.stderr
    expected = line.format(url=h.url, cache=env["HF_HUB_CACHE"], flag="--model (LINEAGE_MODEL)")
    assert _one_line(done.stderr) == f"lineage serve: error: {expected}"
    assert not [p for _, p, _ in h.requests if p.endswith(".safetensors")]  # no weights


def test_the_gated_repository_downloads_with_the_right_token(local_hub, random_model_dir):
    h, env = local_hub
    h.add_dir("org/gated", random_model_dir, gated_token="right")
    path = hub.resolve("org/gated", hub.HubSettings.from_env({**env, "HF_TOKEN": "right"}))
    assert (path / "model.safetensors").is_file()


def test_a_local_directory_is_taken_as_before(random_model_dir, tmp_path):
    assert hub.parse_ref(str(random_model_dir)) is None
    assert hub.parse_ref("./org/name") is None
    assert hub.parse_ref("org/name@v1") == hub.ModelRef("org/name", "v1")
    settings = hub.HubSettings(endpoint="http://127.0.0.1:9", cache_dir=tmp_path)
    assert hub.resolve(str(random_model_dir), settings) == random_model_dir


def test_every_model_and_draft_model_by_name_becomes_its_snapshot(local_hub):
    from engine.config import EngineConfig
    from engine.server.running.preflight import fetch_models

    h, env = local_hub
    settings = _settings(env)
    snapshot = str(
        fetch.repo_folder(settings, hub.parse_ref("org/tiny")) / "snapshots" / ("a" * 40)
    )
    flags = {"model": ["org/tiny"], "draft_model": "org/tiny", "speculative": "draft"}
    config = fetch_models(EngineConfig.from_sources(flags, {}), settings)
    assert (config.model.path, config.model.draft_model) == (snapshot, snapshot)
    assert config.fleet.models[0].path == snapshot
    fleet = {"model": ["one=org/tiny,draft_model=org/tiny,speculative=draft", "two="]}
    config = fetch_models(EngineConfig.from_sources(fleet, {}), settings)
    one, two = config.fleet.models
    assert (one.path, one.draft_model, two.path) == (snapshot, snapshot, None)
    assert len([p for _, p, _ in h.requests if p.startswith("/api/")]) == 1  # fetched once
