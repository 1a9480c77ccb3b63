"""What agents say: tool definitions, tool calls and results, user turns, system texts.

The text of `lineage bench agents`' traffic (clients.bench.agents.traffic), seeded
and tokenizer-free: tool definitions with realistic JSON schemas filling a
token budget, tool calls and results shaped by the tool, user turns and their
edits, and the long system text with its clock variant. Sizes are estimates
(`clients.fanout.estimate_tokens`). Plain Python.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from clients.fanout import estimate_tokens, make_system_prompt

FAMILIES = {
    "fs": ("file in the workspace", ["read", "write", "delete", "move", "stat", "glob"]),
    "git": ("the git repository", ["status", "diff", "log", "commit", "checkout", "blame"]),
    "github": ("the GitHub project", ["create_issue", "comment", "list_pulls", "review_pull"]),
    "tests": ("the test suite", ["run", "list", "rerun_failed", "coverage"]),
    "shell": ("a sandboxed shell", ["run", "background", "kill"]),
    "search": ("the code index", ["grep", "symbols", "references", "definitions"]),
    "docs": ("the documentation site", ["search", "fetch_page"]),
    "db": ("the development database", ["query", "schema", "migrate"]),
    "browser": ("a headless browser", ["open", "click", "screenshot"]),
    "tracker": ("the issue tracker", ["create_ticket", "update_ticket", "search_tickets"]),
}
PARAMS = [
    ("path", {"type": "string", "description": "Path relative to the workspace root."}),
    (
        "paths",
        {
            "type": "array",
            "items": {"type": "string"},
            "description": "Paths relative to the workspace root, processed in order.",
        },
    ),
    ("start_line", {"type": "integer", "minimum": 1, "description": "First line (1-based)."}),
    ("end_line", {"type": "integer", "minimum": 1, "description": "Last line, inclusive."}),
    ("pattern", {"type": "string", "description": "A regular expression in ripgrep syntax."}),
    ("glob", {"type": "string", "description": "Only consider files matching this glob."}),
    ("max_results", {"type": "integer", "default": 50, "description": "Stop after this many."}),
    ("timeout_s", {"type": "number", "default": 120, "description": "Seconds before giving up."}),
    (
        "mode",
        {
            "type": "string",
            "enum": ["fast", "thorough", "dry_run"],
            "description": "How much work to do; dry_run changes nothing.",
        },
    ),
    (
        "format",
        {
            "type": "string",
            "enum": ["text", "json", "markdown"],
            "description": "Shape of the returned content.",
        },
    ),
    ("recursive", {"type": "boolean", "default": False, "description": "Descend into folders."}),
    ("title", {"type": "string", "description": "A short, specific title."}),
    ("body", {"type": "string", "description": "Markdown body; keep it factual."}),
    (
        "labels",
        {
            "type": "array",
            "items": {
                "type": "string",
                "enum": ["bug", "enhancement", "question", "performance", "docs"],
            },
            "description": "Labels to attach.",
        },
    ),
    (
        "env",
        {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Extra environment variables for the command.",
        },
    ),
    (
        "options",
        {
            "type": "object",
            "description": "Advanced options.",
            "properties": {
                "retries": {"type": "integer", "default": 0, "description": "Retries on failure."},
                "verbose": {"type": "boolean", "default": False, "description": "Log every step."},
                "cwd": {"type": "string", "description": "Working directory, relative."},
            },
        },
    ),
    ("ref", {"type": "string", "description": "A branch, tag or commit hash."}),
    ("query", {"type": "string", "description": "What to look for, in plain words."}),
]
WHY = [
    "Use it before editing anything you have not read.",
    "Prefer it over the shell when both would work.",
    "It is read-only and safe to call in parallel.",
    "It changes the workspace: say why before calling it.",
    "Results are truncated; narrow the request instead of paging through everything.",
    "Errors come back as text; read them before retrying.",
]
CODE = [
    "def {f}(self, {a}):",
    "    if {a} is None:",
    "        raise ValueError('{a} is missing')",
    "    for item in self.{a}s:",
    "        total += item.size",
    "    return {f}_result",
    "class {F}:",
    "    '''Holds the {a} of one request.'''",
    "import {a}",
    "# TODO: {f}",
]
WORDS = [
    "cache",
    "entry",
    "token",
    "budget",
    "lineage",
    "anchor",
    "request",
    "reply",
    "batch",
    "tier",
    "index",
    "plan",
    "commit",
    "restore",
    "prompt",
    "session",
    "config",
    "worker",
]


def make_tools(budget: int, seed: int = 0) -> list[dict]:
    """Tool definitions (OpenAI style, realistic JSON schemas) of ~`budget` estimated tokens."""
    rng = random.Random(f"tools-{seed}")
    tools: list[dict] = []
    used = 2
    for family, (what, actions) in FAMILIES.items():
        for action in actions:
            tool = _tool(rng, family, what, action)
            cost = estimate_tokens(json.dumps(tool)) + 1
            if tools and used + cost > budget:
                return tools
            tools.append(tool)
            used += cost
    return tools


def _tool(rng: random.Random, family: str, what: str, action: str) -> dict:
    params = rng.sample(PARAMS, rng.randint(2, 5))
    properties = {name: schema for name, schema in params}
    required = [params[0][0]] + ([params[1][0]] if rng.random() < 0.4 else [])
    words = action.replace("_", " ")
    description = (
        f"{words.capitalize()}: acts on {what}. {rng.choice(WHY)} {rng.choice(WHY)} "
        f"Returns a {rng.choice(['JSON object', 'plain-text report', 'list of matches'])}"
        f" describing the outcome."
    )
    return {
        "type": "function",
        "function": {
            "name": f"{family}_{action}",
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def make_systems(
    prefix_tokens: int, tools: list[dict], seed: int = 0
) -> tuple[str, Callable[[int], str]]:
    """(main system text, clock(minute) -> timestamped text) filling the prefix budget.

    The clock text is the main text with an environment section (holding the
    timestamp) inserted at about 60% of it, at a line boundary.
    """
    rest = max(prefix_tokens - estimate_tokens(json.dumps(tools)), 20)
    body = make_system_prompt(rest, seed)
    lines = body.split("\n")
    cut = max(1, int(len(lines) * 0.6))
    head, tail = "\n".join(lines[:cut]), "\n".join(lines[cut:])

    def clock(minute: int) -> str:
        h, m = divmod(9 * 60 + minute, 60)
        env = (
            f"\n## Environment\n- Current time: 2025-06-02 {h % 24:02d}:{m:02d} UTC\n"
            f"- Working directory: /workspace/lineage\n"
        )
        return head + env + tail + team_role("scheduler")

    return body, clock


def team_role(name: str) -> str:
    """The end of a sub-agent's system text: its role in the team."""
    return f"\n\nYour role in this team: {name}. Report back to the lead agent when done."


def tool_result(rng: random.Random, name: str, size: int) -> str:
    """A tool's output of about `size` estimated tokens, shaped by the tool."""
    lines: list[str] = []
    used = 0
    while used < size:
        f, a = rng.choice(WORDS), rng.choice(WORDS)
        if name.startswith(("fs_", "search_")):
            line = rng.choice(CODE).format(f=f, a=a, F=f.capitalize())
            if name.startswith("search_"):
                line = f"src/{a}/{f}.py:{rng.randint(1, 900)}: {line.strip()}"
        elif name.startswith(("shell_", "tests_")):
            line = (
                f"[{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}] "
                f"{rng.choice(['PASS', 'FAIL', 'ok', 'warning:'])} {f}_{a} "
                f"({rng.randint(1, 400)} ms)"
            )
        else:
            line = json.dumps(
                {
                    "id": rng.randint(1, 9999),
                    "name": f"{f}-{a}",
                    "state": rng.choice(["open", "closed", "merged"]),
                }
            )
        lines.append(line)
        used += estimate_tokens(line)
    return "\n".join(lines)


def tool_call(rng: random.Random, tag: str, tools: list[dict]) -> dict:
    fn = rng.choice(tools)["function"]
    args = {}
    for name, schema in fn["parameters"]["properties"].items():
        if name in fn["parameters"]["required"] or rng.random() < 0.3:
            args[name] = _argument(rng, schema)
    return {
        "id": f"call_{tag}",
        "type": "function",
        "function": {"name": fn["name"], "arguments": json.dumps(args)},
    }


def _argument(rng: random.Random, schema: dict):
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return rng.randint(1, 400)
    if kind == "number":
        return rng.choice([30, 60, 120.5])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [f"src/{rng.choice(WORDS)}.py" for _ in range(rng.randint(1, 3))]
    if kind == "object":
        return {"retries": rng.randint(0, 2)}
    return f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"


def user_text(rng: random.Random, lane: int, session: int, turn: int) -> str:
    x, y = rng.choice(WORDS), rng.choice(WORDS)
    task = rng.choice(
        [
            f"find where the {x} {y} is computed and explain it",
            f"write a unit test for the {x} {y} code path",
            f"fix the off-by-one error in the {x} {y} loop",
            f"check why the {x} {y} step is slow on long prompts",
        ]
    )
    return f"Sub-agent {lane}, session {session}, step {turn + 1}: please {task}."


def pasted_file(rng: random.Random, size: int) -> str:
    """A user turn pasting a source file of about `size` estimated tokens, then asking."""
    path = f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"
    code = tool_result(rng, "fs_read", size)
    return f"Here is {path}:\n```python\n{code}\n```\nWhy does its last function fail?"


def edit_line(text: str, depth: float) -> str:
    """`text` with its line `depth` of the way in rewritten (a user fixing a paste)."""
    lines = text.split("\n")
    k = min(int(len(lines) * depth), len(lines) - 1)
    indent = lines[k][: len(lines[k]) - len(lines[k].lstrip())]
    lines[k] = f"{indent}return None  # fixed: was {lines[k].strip()[:24]!r}"
    return "\n".join(lines)


def truncated(text: str, keep: float) -> str:
    """`text` cut at a line boundary `keep` of the way in, as an agent trims an old output."""
    lines = text.split("\n")
    kept = lines[: max(1, int(len(lines) * keep))]
    return "\n".join(kept) + f"\n[... {len(lines) - len(kept)} more lines truncated]"


def edited_user_text(rng: random.Random, text: str) -> str:
    """A user turn `text` as the user edits it: its tail rewritten."""
    return text.rsplit(" ", 2)[0] + f" {rng.choice(WORDS)} path, and keep the public API unchanged."
