"""The coding agents themselves, run headless against the session's `lineage serve
--http-port` on the embedded model (the `served` fixture), as a user runs them: Claude
Code (`claude -p`, with its default model and with `--model`, then `--continue`), Codex
CLI (`codex exec` with the config.toml of docs/howto/agents.md, then `exec resume
--last`) and OpenCode (`opencode run`, then `--continue`).

Claude Code with `--model` runs in the deep run alone (`LINEAGE_DEEP_TESTS=1`): its
default-model run already routes a `claude-*` name through the alias and restores.

Each agent runs twice against one server through a recording proxy
(tests/agents/recorder.py) and must exit 0 with every request answered 2xx, its second
run restoring at least 0.9 of its prompts from the cache, and nothing of the model's
markup in what it prints. The CLIs come from scripts/install_agents.sh (pinned, into
.cache/agents, or `LINEAGE_AGENTS_DIR`); without them these tests skip, saying so. Every
CLI is pointed at localhost, with its telemetry, updates and other network features off.
`LINEAGE_AGENTS_CAPTURE=DIR` saves each run's request bodies there (the fixtures of
tests/agents/test_agent_requests.py come from such runs).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents.recorder import Recorder
from tests.deep import deep

ROOT = Path(__file__).resolve().parents[2]
AGENTS = Path(os.environ.get("LINEAGE_AGENTS_DIR", ROOT / ".cache" / "agents"))
BIN = AGENTS / "node_modules" / ".bin"
MARKUP = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_start|>", "<|im_end|>")
RUN_TIMEOUT = 600  # seconds per CLI run: a cold Claude Code prompt is ~17k tokens

pytestmark = pytest.mark.ray  # a server with Ray, MLX and the bridge in it


@pytest.fixture
def server(served):
    """The session's `lineage serve --http-port` on the embedded model (the `served`
    fixture), serving the agents' model names: its HTTP port."""
    if not BIN.is_dir():
        pytest.skip(f"no agent CLIs in {AGENTS}: run scripts/install_agents.sh")
    return served.http


@dataclass(frozen=True)
class Agent:
    id: str  # the test's id
    name: str  # the CLI's binary
    runs: tuple[tuple[str, ...], tuple[str, ...]]  # its arguments, first and second run


def _setup(agent: Agent, home: Path, url: str) -> dict:
    """The agent's environment (and config files under `home`), pointed at `url`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}
    env |= {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    env |= {"XDG_DATA_HOME": str(home / ".data"), "XDG_CACHE_HOME": str(home / ".cache")}
    env |= {"XDG_STATE_HOME": str(home / ".state"), "NO_UPDATE_NOTIFIER": "1"}
    if agent.name == "claude":
        env |= {
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_AUTH_TOKEN": "unused",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            # the tiny model ends a reply by itself; a reply cut at the cap is an error to it
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        }
    elif agent.name == "codex":
        codex = home / ".codex"
        codex.mkdir(parents=True)
        (codex / "config.toml").write_text(
            'model = "lineage"\nmodel_provider = "lineage"\n\n'
            "[model_providers.lineage]\n"
            'name = "lineage"\n'
            f'base_url = "{url}/v1"\n'
            'env_key = "LINEAGE_API_KEY"\n'
            'wire_api = "responses"\n\n'
            "[analytics]\nenabled = false\n"
        )
        env |= {"CODEX_HOME": str(codex), "LINEAGE_API_KEY": "unused"}
    else:
        config = home / ".config" / "opencode"
        config.mkdir(parents=True)
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "name": "lineage",
            "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
            "models": {"lineage": {"name": "lineage"}},
        }
        settings = {"autoupdate": False, "share": "disabled", "model": "lineage/lineage"}
        (config / "opencode.json").write_text(
            json.dumps(settings | {"provider": {"lineage": provider}})
        )
        env |= {
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
    return env


def prompt_share(exchanges) -> float:
    """Of the prompt tokens of these requests, the share the cache restored (any wire)."""
    cached = total = 0
    for ex in exchanges:
        u = ex.usage or {}
        if "cache_read_input_tokens" in u:  # Anthropic: the three add up to the prompt
            c = u["cache_read_input_tokens"]
            t = c + u.get("cache_creation_input_tokens", 0) + u.get("input_tokens", 0)
        elif "input_tokens_details" in u:  # Responses
            c, t = u["input_tokens_details"].get("cached_tokens", 0), u["input_tokens"]
        elif "prompt_tokens" in u:  # chat completions
            c = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            t = u["prompt_tokens"]
        else:
            continue
        cached, total = cached + c, total + t
    return cached / total if total else 0.0


AGENTS_RUN = [
    Agent(
        "claude-default",
        "claude",
        (
            ("-p", "Say hello.", "--max-turns", "1"),
            ("-p", "And again.", "--continue", "--max-turns", "1"),
        ),
    ),
    Agent(
        "codex-exec",
        "codex",
        (
            ("exec", "--skip-git-repo-check", "Say hello."),
            ("exec", "--skip-git-repo-check", "resume", "--last", "And again."),
        ),
    ),
    Agent("opencode-run", "opencode", (("run", "Say hello."), ("run", "--continue", "And again."))),
]
CLAUDE_MODEL = Agent(
    "claude-model",
    "claude",
    (
        ("-p", "Say hello.", "--max-turns", "1", "--model", "claude-sonnet-4-5"),
        ("-p", "Say hello.", "--max-turns", "1", "--model", "claude-sonnet-4-5"),
    ),
)
DEEP_ONLY = pytest.mark.skipif(not deep(), reason="a deep test: LINEAGE_DEEP_TESTS=1")
CASES = [
    pytest.param(a, id=a.id, marks=DEEP_ONLY if a is CLAUDE_MODEL else ())
    for a in (AGENTS_RUN[0], CLAUDE_MODEL, *AGENTS_RUN[1:])
]


@pytest.mark.parametrize("agent", CASES)
def test_an_agent_completes_two_runs_and_the_second_restores_its_prompt(server, agent, tmp_path):
    binary = BIN / agent.name
    if not binary.exists():
        pytest.skip(f"{agent.name} is not installed in {AGENTS}: run scripts/install_agents.sh")
    recorder = Recorder(server)
    home, work = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    work.mkdir()
    env = _setup(agent, home, f"http://127.0.0.1:{recorder.port}")
    try:
        seen = []
        for argv in agent.runs:
            start = len(recorder.exchanges)
            done = subprocess.run(
                [str(binary), *argv],
                env=env,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
            seen.append((done, recorder.exchanges[start:]))
    finally:
        recorder.close()
        capture = os.environ.get("LINEAGE_AGENTS_CAPTURE")
        if capture:
            Path(capture).mkdir(parents=True, exist_ok=True)
            runs = [[ex.__dict__ for ex in exchanges] for _, exchanges in seen]
            (Path(capture) / f"{agent.id}.json").write_text(json.dumps(runs, indent=1))
    for i, (done, exchanges) in enumerate(seen):  # the figures, shown with -rP
        print(
            f"{agent.id} run {i + 1}: exit {done.returncode}, {len(exchanges)} requests "
            f"{sorted({ex.status for ex in exchanges})}, restored {prompt_share(exchanges):.3f}"
        )
    for done, exchanges in seen:
        shown = f"{done.args}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert done.returncode == 0, shown
        model_calls = [ex for ex in exchanges if ex.usage is not None]
        assert model_calls, f"no request reached the model\n{shown}"
        assert all(200 <= ex.status < 300 for ex in exchanges), [
            (ex.path, ex.status) for ex in exchanges
        ]
        assert not [m for m in MARKUP if m in done.stdout], shown
    share = prompt_share(seen[1][1])
    assert share >= 0.9, f"the second run restored {share:.3f} of its prompts"
