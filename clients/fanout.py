"""Parallel sub-agents sharing one long system prompt and tools, as a library.

`lineage fanout` (clients.cli.fanout) runs them; the benchmarks' traffic and
the tests build on its prompts (`make_shared_prefix`, `user_message`). Knows
how agent frameworks talk to an engine (the whole conversation re-sent every
turn, one shared system + tools prefix); knows nothing about the cache.
The shared prefix is generated deterministically from a seed, sized by a
tokenizer-free estimate (`estimate_tokens`), so runs are comparable.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
from dataclasses import asdict, dataclass

from clients.client import AsyncClient, Result

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# Tool definitions in OpenAI style, in the order they are added to the prefix.
_TOOLS = [
    (
        "read_file",
        "Read a text file from the workspace and return its contents with line numbers.",
        {
            "path": ("string", "Path relative to the workspace root."),
            "start_line": ("integer", "First line to return (1-based)."),
            "end_line": ("integer", "Last line to return, inclusive."),
        },
        ["path"],
    ),
    (
        "write_file",
        "Create or overwrite a file in the workspace with the given contents.",
        {
            "path": ("string", "Path relative to the workspace root."),
            "content": ("string", "The complete new contents of the file."),
        },
        ["path", "content"],
    ),
    (
        "run_shell",
        "Run a shell command in the workspace and return its exit code and output.",
        {
            "command": ("string", "The command line to run with bash."),
            "timeout_s": ("integer", "Seconds before the command is killed."),
        },
        ["command"],
    ),
    (
        "search_code",
        "Search the repository for a regular expression and list matching lines.",
        {
            "pattern": ("string", "A regular expression (ripgrep syntax)."),
            "glob": ("string", "Only search files matching this glob, e.g. '*.py'."),
            "max_results": ("integer", "Stop after this many matches."),
        },
        ["pattern"],
    ),
    (
        "list_dir",
        "List the entries of a directory with their sizes and kinds.",
        {
            "path": ("string", "Directory relative to the workspace root."),
            "recursive": ("boolean", "Descend into subdirectories."),
        },
        ["path"],
    ),
    (
        "apply_patch",
        "Apply a unified diff to the workspace; fails if any hunk does not apply.",
        {"patch": ("string", "The diff text, with ---/+++ headers.")},
        ["patch"],
    ),
]

_SECTIONS = [
    "Role",
    "Workflow",
    "Code style",
    "Testing",
    "Tool use",
    "Safety",
    "Communication",
    "Git hygiene",
    "Performance",
    "Reviews",
]
_SUBJECTS = [
    "the repository",
    "every change",
    "a failing test",
    "the user's request",
    "a new module",
    "the public API",
    "each tool call",
    "the build",
    "a refactor",
    "the error message",
    "the documentation",
    "a dependency",
]
_VERBS = [
    "Read",
    "Check",
    "Keep",
    "Explain",
    "Verify",
    "Prefer",
    "Avoid breaking",
    "Document",
    "Test",
    "Review",
    "Summarize",
    "Measure",
]
_CLAUSES = [
    "before you edit anything",
    "in as few steps as possible",
    "so that a colleague can follow your reasoning",
    "and report what you changed",
    "unless the user asks otherwise",
    "using the tools listed above",
    "without guessing at file contents",
    "and stop when the task is complete",
    "with small, focused commits",
    "and quote the exact command you ran",
    "while keeping the existing behaviour",
    "and mention any risk you see",
]
_TASKS = [
    "find where {x} is defined and explain what it does",
    "write a unit test for {x}",
    "rename {x} and update every caller",
    "check why {x} is slow on large inputs",
    "add type hints to {x}",
    "summarize the recent changes around {x}",
    "fix the off-by-one error in {x}",
    "list the modules that import {x}",
]
_NAMES = [
    "parse_config",
    "CacheIndex.lookup",
    "the retry loop",
    "TokenBudget",
    "load_weights",
    "the HTTP handler",
    "merge_batches",
    "the CLI entry point",
    "Scheduler.step",
    "write_atomic",
]


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: one token per word piece or punctuation mark."""
    return len(_TOKEN_RE.findall(text))


def _tool(name: str, description: str, params: dict, required: list[str]) -> dict:
    properties = {k: {"type": t, "description": d} for k, (t, d) in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def make_tools(budget: int) -> list[dict]:
    """The leading tool definitions whose JSON fits `budget` estimated tokens (at least one)."""
    tools: list[dict] = []
    for spec in _TOOLS:
        tool = _tool(*spec)
        if tools and estimate_tokens(json.dumps(tools + [tool])) > budget:
            break
        tools.append(tool)
    return tools


def _sentence(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)} {rng.choice(_SUBJECTS)} {rng.choice(_CLAUSES)}."


def make_system_prompt(tokens: int, seed: int = 0) -> str:
    """A deterministic coding-agent system prompt of about `tokens` estimated tokens.

    Sections of seven rules each; the last line is cut short to fit. Estimates
    add up across lines (a newline never splits a token), so it is counted once.
    """
    rng = random.Random(f"system-{seed}")
    lines = ["You are a careful software engineering agent working in a shared repository."]
    used = estimate_tokens(lines[0])
    for n in itertools.count():
        line = f"- {_sentence(rng)}"
        if n % 7 == 0:
            line = f"\n## {_SECTIONS[(n // 7) % len(_SECTIONS)]}\n{line}"
        cost = estimate_tokens(line)
        if used + cost > tokens:
            break
        lines.append(line)
        used += cost
    words = line.split(" ")
    while words and used + estimate_tokens(" ".join(words)) > tokens:
        words.pop()
    if words:
        lines.append(" ".join(words))
    return "\n".join(lines)


def make_shared_prefix(system_tokens: int, seed: int = 0) -> tuple[str, list[dict]]:
    """(system text, tools) of about `system_tokens` estimated tokens together.

    Tools take up to a third of the budget; the system text fills the rest.
    Same arguments, same output.
    """
    if system_tokens <= 0:
        raise ValueError(f"system_tokens must be > 0, got {system_tokens}")
    tools = make_tools(system_tokens // 3)
    rest = max(system_tokens - estimate_tokens(json.dumps(tools)), 1)
    return make_system_prompt(rest, seed), tools


def user_message(agent: int, turn: int, seed: int = 0) -> str:
    """The deterministic task text of `agent` at `turn`."""
    rng = random.Random(f"user-{seed}-{agent}-{turn}")
    task = rng.choice(_TASKS).format(x=rng.choice(_NAMES))
    return f"Sub-agent {agent}, step {turn + 1}: please {task}."


@dataclass(frozen=True)
class Row:
    """One turn of one agent as measured by the client."""

    agent: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    restore_kind: str
    restore_length: int
    ttft_ms: float
    completion_tokens: int
    finish_reason: str

    @staticmethod
    def of(agent: int, turn: int, result: Result) -> "Row":
        return Row(
            agent,
            turn,
            result.usage.prompt_tokens,
            result.usage.cached_tokens,
            result.restore.kind,
            result.restore.length,
            result.timing.ttft_ms,
            result.usage.completion_tokens,
            result.finish_reason,
        )


async def run_agent(
    client: AsyncClient,
    agent: int,
    system: str,
    tools: list[dict],
    turns: int,
    max_tokens: int,
    seed: int,
    namespace: str = "",
) -> list[Row]:
    """One sub-agent: `turns` turns, re-sending the whole conversation each turn."""
    messages = [{"role": "system", "content": system}]
    rows = []
    for turn in range(turns):
        messages.append({"role": "user", "content": user_message(agent, turn, seed)})
        result = await client.generate(
            messages=messages, tools=tools, max_tokens=max_tokens, seed=seed, namespace=namespace
        )
        messages.append({"role": "assistant", "content": result.text})
        rows.append(Row.of(agent, turn, result))
    return rows


async def run_fanout(
    server: str,
    agents: int,
    turns: int,
    system_tokens: int,
    max_tokens: int,
    seed: int = 0,
    namespace: str = "",
    connect: dict | None = None,
) -> list[Row]:
    """All agents at once against `server`; rows sorted by (agent, turn)."""
    system, tools = make_shared_prefix(system_tokens, seed)
    async with AsyncClient(server, **(connect or {})) as client:
        per_agent = await asyncio.gather(
            *(
                run_agent(client, a, system, tools, turns, max_tokens, seed, namespace)
                for a in range(agents)
            )
        )
    return sorted((r for rows in per_agent for r in rows), key=lambda r: (r.agent, r.turn))


def summary(rows: list[Row]) -> dict:
    """Totals over rows: prompt tokens, cached tokens and their fraction."""
    prompt = sum(r.prompt_tokens for r in rows)
    cached = sum(r.cached_tokens for r in rows)
    return {
        "requests": len(rows),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_fraction": cached / prompt if prompt else 0.0,
    }


def format_table(rows: list[Row]) -> str:
    """The per-agent, per-turn table plus the summary line."""
    head = f"{'agent':>5} {'turn':>4} {'prompt':>7} {'cached':>7} {'restore':<10} {'ttft ms':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.agent:>5} {r.turn:>4} {r.prompt_tokens:>7} {r.cached_tokens:>7} "
            f"{r.restore_kind:<10} {r.ttft_ms:>9.1f}"
        )
    s = summary(rows)
    lines.append(
        f"total: {s['prompt_tokens']} prompt tokens, {s['cached_tokens']} cached "
        f"({s['cached_fraction']:.1%}) over {s['requests']} requests"
    )
    return "\n".join(lines)


def rows_to_json(rows: list[Row]) -> dict:
    """{"rows": [...], "summary": {...}}, as written by `--json FILE`."""
    return {"rows": [asdict(r) for r in rows], "summary": summary(rows)}
