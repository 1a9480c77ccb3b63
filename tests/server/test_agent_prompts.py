"""Agent prompts through the real server (gRPC, Ray, MLX): Claude Code's billing line does
not keep a turn from the cache, and a miss is explained in the log, Inspect and `lineage top`."""

from __future__ import annotations

import argparse
import logging

from clients.client import Client


def billing(cch: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch={cch};"


SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude.\n" + (
    "Use the tools to read and edit files; keep answers short.\n" * 12
)


def claude_code(first_line: str, *turns: str) -> list[dict]:
    """Claude Code's shape: its first system block is the billing line alone."""
    return [
        {"role": "system", "content": first_line},
        {"role": "system", "content": SYSTEM},
        *({"role": "user", "content": t} for t in turns),
    ]


def _log_lines(caplog, request_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "lineage.request" and f"id={request_id} " in r.getMessage()
    ]


def test_requests_differing_only_in_the_billing_line_hit_the_cache(engine, caplog):
    with Client(engine.address) as client, caplog.at_level(logging.INFO, "lineage.request"):
        ask = dict(max_tokens=2, namespace="claude-code", temperature=0.0)
        first = client.generate(claude_code(billing("71fea"), "Read setup.py"), **ask)
        second = client.generate(claude_code(billing("0aaa9"), "Read setup.py"), **ask)
        info = client.model_info()
    assert info["output_format"] == "qwen"  # the embedded template's markup
    assert first.usage.cached_tokens == 0 and first.usage.prompt_tokens > 100
    # The same prompt once the line is gone: the second restores all of it.
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    assert second.usage.cached_tokens == second.usage.prompt_tokens
    for result in (first, second):
        (line,) = _log_lines(caplog, result.request_id)
        assert " volatile=1 " in line and " miss=- " in line


def test_a_changed_system_line_is_explained_in_the_log_inspect_and_top(engine, caplog):
    from rich.console import Console

    from clients.cli import top

    ask = dict(max_tokens=2, namespace="explained", temperature=0.0)
    with Client(engine.address) as client, caplog.at_level(logging.INFO, "lineage.request"):
        first = client.generate(claude_code("session 1 at 10:00", "Read setup.py"), **ask)
        # A line no rule knows, changed: the prompt leaves the first one inside message 0.
        second = client.generate(claude_code("session 1 at 10:01", "Read setup.py"), **ask)
        live = client.inspect(recent=10)
    assert second.usage.cached_tokens < first.usage.prompt_tokens
    (line,) = _log_lines(caplog, second.request_id)
    assert " volatile=0 " in line
    miss = line.split(" miss=")[1].split()[0]
    kind, where = miss.split("@")
    token, message = where.split("/")
    assert (kind, message) == ("system", "m0") and 0 < int(token) < 40
    (record,) = [r for r in live["recent"] if r["request_id"] == second.request_id]
    assert (record["miss_kind"], record["miss_token"], record["miss_message"]) == (
        "system",
        int(token),
        0,
    )
    assert live["cache"]["misses"].get("system", 0) >= 1
    console = Console(record=True, width=200, force_terminal=False)
    args = argparse.Namespace(server=engine.address, once=True, requests=10, interval=1.0, model="")
    assert top.run(args, console) == 0
    assert f"system@{token} m0" in console.export_text()
