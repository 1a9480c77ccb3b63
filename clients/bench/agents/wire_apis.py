"""`lineage bench agents --api ...`: the same agent traffic through each HTTP wire format.

For each API asked (`chat`: OpenAI chat completions, `messages`: Anthropic
Messages, `responses`: OpenAI Responses) a fresh lineage engine and the bridge
in front of it serve the traffic of clients.bench.agents.traffic, one thread per lane,
streaming over HTTP as agent clients do; each request's messages are written in
that wire's shape (`chat_body`, `messages_body`, `responses_body`), its reply
read back from the events, its cached tokens from the wire's own usage field
(`prompt_tokens_details.cached_tokens`, `cache_read_input_tokens`,
`input_tokens_details.cached_tokens`). The prompt each renders to is checked
against the one rendered here, token for token, so the three carry the same
traffic and share the same oracle. Responses chains a session's turns by
`previous_response_id`, sending only the items after the stored reply.

`chain_figures` runs one 40-turn conversation through Responses, chained by
`previous_response_id` and sending the whole input every turn, three times each,
and records per turn the request's bytes and the medians of the bridge's time
to build the engine's prompt (the `X-Lineage-Prompt-Build-Ms` header) and of
the engine's time to render and tokenize it (its prompt builder, timed here).
MLX, Ray and the bridge load inside the functions.
"""

from __future__ import annotations

import json
import time

from clients.bench.agents.observed import Observed, PolicyRun

APIS = ("chat", "messages", "responses")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
CHAIN_TURNS = 40
CHAIN_REPORTED = (1, 10, 40)
CHAIN_REPEATS = 3  # the timings reported are medians over this many runs of the chain


# ------------------------------------------------------------ the bodies ----


def chat_body(messages: list, tools: list, spec) -> dict:
    return {
        "model": "lineage",
        "messages": messages,
        "tools": tools,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def messages_body(messages: list, tools: list, spec) -> dict:
    """Chat messages as an Anthropic request: tool calls as tool_use blocks, tool results
    as tool_result blocks of the user turn after them."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    turns: list[dict] = []

    def add(role: str, blocks: list) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})

    for m in messages:
        if m["role"] == "user":
            add("user", [{"type": "text", "text": m["content"]}])
        elif m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"]}
            add("user", [dict(result, content=m["content"])])
        elif m["role"] == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for call in m.get("tool_calls", ()):
                fn = call["function"]
                use = {"type": "tool_use", "id": call["id"], "name": fn["name"]}
                blocks.append(dict(use, input=json.loads(fn["arguments"])))
            add("assistant", blocks)
    return {
        "model": "claude-bench",
        "system": system,
        "messages": turns,
        "tools": [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "input_schema": t["function"]["parameters"],
            }
            for t in tools
        ],
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": True,
    }


def response_items(messages: list) -> list[dict]:
    """Chat messages (no system) as Responses input items."""
    items = []
    for m in messages:
        if m["role"] == "user":
            items.append(
                {"role": "user", "content": [{"type": "input_text", "text": m["content"]}]}
            )
        elif m["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
        elif m["role"] == "assistant":
            if m.get("content"):
                text = [{"type": "output_text", "text": m["content"]}]
                items.append({"type": "message", "role": "assistant", "content": text})
            for call in m.get("tool_calls", ()):
                fn = call["function"]
                call_item = {"type": "function_call", "call_id": call["id"], "name": fn["name"]}
                items.append(dict(call_item, arguments=fn["arguments"]))
    return items


class Chains:
    """Per session, the stored responses and what they hold, to send only what is new."""

    def __init__(self):
        self.stored: dict[str, list[tuple[str, list]]] = {}

    def body(self, session: str, messages: list, tools: list, max_tokens: int, store=True):
        system = [m for m in messages if m["role"] == "system"]
        rest = messages[len(system) :]
        body = {
            "model": "gpt-bench",
            "instructions": "\n\n".join(m["content"] for m in system) or None,
            "tools": [dict(t["function"], type="function") for t in tools],
            "max_output_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "store": store,
        }
        for response_id, held in reversed(self.stored.get(session, [])):
            n = len(held)
            if _continues(held, rest):  # the stored reply, then maybe its calls, then more
                body["previous_response_id"] = response_id
                calls = [{**rest[n - 1], "content": ""}] if rest[n - 1].get("tool_calls") else []
                return body | {"input": response_items(calls + rest[n:])}
        return body | {"input": response_items(rest)}

    def record(self, session: str, messages: list, reply: str, response_id: str | None):
        if response_id:
            rest = [m for m in messages if m["role"] != "system"]
            held = rest + [{"role": "assistant", "content": reply}]
            self.stored.setdefault(session, []).append((response_id, held))


def _continues(held: list, rest: list) -> bool:
    n = len(held)
    if len(rest) < n or rest[: n - 1] != held[:-1]:
        return False
    last = rest[n - 1]
    return last["role"] == "assistant" and last.get("content", "") == held[-1]["content"]


# ----------------------------------------------------------- the replies ----


def read_stream(api: str, reply, drop_after: int = 0, pause: float | None = None) -> dict:
    """An SSE reply -> {text, prompt, cached, completed, response_id, ttft_ms}. `pause`:
    seconds slept after each line read (a slow reader)."""
    out = {"text": "", "prompt": 0, "cached": 0, "completed": False, "response_id": None}
    t0, first, chunks = time.perf_counter(), None, 0
    for line in reply.iter_lines():
        if pause:
            time.sleep(pause)
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        delta = _delta(api, event)
        if delta:
            first = first or time.perf_counter()
            out["text"] += delta
            chunks += 1
            if drop_after and chunks >= drop_after:
                break
        _usage(api, event, out)
        error = event.get("error") or (event.get("response") or {}).get("error")
        if error:  # the server's own word on why the stream ends
            out["error"] = error.get("message", str(error)) if isinstance(error, dict) else error
    out["ttft_ms"] = ((first or time.perf_counter()) - t0) * 1000
    return out


def _delta(api: str, event: dict) -> str:
    if api == "chat":
        return "".join(c["delta"].get("content") or "" for c in event.get("choices", ()))
    if api == "messages":
        delta = event.get("delta", {}) if event.get("type") == "content_block_delta" else {}
        return delta.get("text", "")
    return event.get("delta", "") if event.get("type") == "response.output_text.delta" else ""


def _usage(api: str, event: dict, out: dict) -> None:
    if api == "chat" and event.get("usage"):
        u = event["usage"]
        out.update(prompt=u["prompt_tokens"], cached=u["prompt_tokens_details"]["cached_tokens"])
        out["completed"] = True
    elif api == "messages" and event.get("type") == "message_delta":
        u = event["usage"]
        total = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        out.update(prompt=total, cached=u["cache_read_input_tokens"], completed=True)
    elif api == "responses" and event.get("type") in ("response.completed", "response.incomplete"):
        u = event["response"]["usage"]
        out.update(prompt=u["input_tokens"], cached=u["input_tokens_details"]["cached_tokens"])
        out.update(completed=True, response_id=event["response"]["id"])


# ---------------------------------------------------------------- serving ----


class Served:
    """A fresh engine (lineage mode) and the bridge in front of it, in this process."""

    def __init__(self, config, store_dir: str):
        from clients.bridge.app import BridgeOptions
        from clients.bridge.models import ServedModels
        from clients.bridge.server import start_bridge
        from engine.server.running.background import BackgroundEngine, BackgroundLoop

        self.engine = BackgroundEngine(config, timeout=600)
        self.loop = BackgroundLoop("bench-bridge")
        options = BridgeOptions(ServedModels((), ("claude-*", "gpt-*")), store_dir)
        self.bridge = self.loop.call(
            start_bridge(self.engine.address, "127.0.0.1", 0, None, options), 60
        )
        self.url = self.bridge.url

    def close(self) -> None:
        try:
            self.loop.call(self.bridge.stop(2.0), 60)
        finally:
            self.loop.close()
            self.engine.stop()


def run_api(api: str, traffic, ids, config, store_dir: str) -> PolicyRun:
    """The traffic through `api` against a fresh engine of `config` and its bridge."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from clients.bench.agents.drive import drive

    served, chains = Served(config, store_dir), Chains()
    try:
        with (
            httpx.Client(base_url=served.url, timeout=600) as http,
            ThreadPoolExecutor(max(1, traffic.agents)) as pool,
        ):

            def send(spec, messages):
                if api == "responses":
                    body = chains.body(spec.session, messages, traffic.tools, spec.max_tokens)
                else:
                    make = chat_body if api == "chat" else messages_body
                    body = make(messages, traffic.tools, spec)
                headers = {"X-Cache-Namespace": spec.namespace} if spec.namespace else {}
                with http.stream("POST", PATHS[api], json=body, headers=headers) as reply:
                    if reply.status_code != 200:
                        raise RuntimeError(f"{api}: {reply.status_code} {reply.read()[:300]!r}")
                    return read_stream(api, reply, spec.drop_after)

            def serve(batch):
                futures = [pool.submit(send, spec, messages) for spec, messages, _ in batch]
                for (spec, messages, prompt), future in zip(batch, futures):
                    got = future.result()
                    done = got["completed"]
                    completion = ids.tokenizer.encode(got["text"], add_special_tokens=False)
                    ob = Observed(
                        spec.rid, spec.step, spec.lane, spec.kind, prompt, completion, done
                    )
                    if done and got["prompt"] != len(prompt):
                        raise RuntimeError(
                            f"{api}: request {spec.rid} rendered to {got['prompt']} tokens on "
                            f"the server, {len(prompt)} here"
                        )
                    if done:
                        ob.cached, ob.ttft_ms = got["cached"], got["ttft_ms"]
                        chains.record(spec.session, messages, got["text"], got["response_id"])
                    yield ob, got["text"]

            def sample():
                return {"ram_bytes": 0, "disk_bytes": 0, "evictions": 0, "disk_bytes_written": 0}

            return drive(f"lineage_{api}", traffic, ids, serve, sample)
    finally:
        served.close()


def chain_figures(
    traffic, ids, config, store_dir: str, turns: int = CHAIN_TURNS, repeats: int = CHAIN_REPEATS
) -> dict:
    """One conversation of `turns` turns through Responses, chained by previous_response_id
    and sending the whole input, `repeats` times each (the same conversation: greedy
    replies); per reported turn: request bytes, and the medians of the bridge's
    prompt-building ms and of the engine's render+tokenize ms."""
    import statistics

    served = Served(config, store_dir)
    out = {}
    try:
        with httpx_client(served.url) as http:
            for mode in ("previous_response_id", "whole_input"):
                runs = [_chain(http, ids, traffic, mode, turns) for _ in range(repeats)]
                rows = []
                for turn_rows in zip(*runs):
                    row = dict(turn_rows[0])
                    for key in ("bridge_build_ms", "engine_render_tokenize_ms"):
                        row[key] = round(statistics.median(r[key] for r in turn_rows), 3)
                    rows.append(row)
                out[mode] = [r for r in rows if r["turn"] in CHAIN_REPORTED or r["turn"] == turns]
    finally:
        served.close()
    return out


def httpx_client(url: str):
    import httpx

    return httpx.Client(base_url=url, timeout=600)


def _chain(http, ids, traffic, mode: str, turns: int) -> list[dict]:
    """One run of the conversation in `mode`: a row per turn."""
    import random

    from clients.bench.agents.agent_text import user_text

    rng, chains = random.Random(7), Chains()
    messages = [{"role": "system", "content": traffic.systems["main"]}]
    rows = []
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": user_text(rng, 0, 0, turn)})
        body = chains.body(mode, messages, traffic.tools, 16, store=True)
        if mode == "whole_input":
            body.pop("previous_response_id", None)
            body["input"] = response_items(messages[1:])
        raw = json.dumps(body).encode()
        headers = {"content-type": "application/json"}
        with http.stream("POST", "/v1/responses", content=raw, headers=headers) as reply:
            build_ms = float(reply.headers["x-lineage-prompt-build-ms"])
            got = read_stream("responses", reply)
        t0 = time.perf_counter()
        ids.encode(messages, traffic.tools)
        engine_ms = (time.perf_counter() - t0) * 1000
        chains.record(mode, messages, got["text"], got["response_id"])
        messages.append({"role": "assistant", "content": got["text"]})
        rows.append(
            {
                "turn": turn,
                "request_bytes": len(raw),
                "bridge_build_ms": build_ms,
                "engine_render_tokenize_ms": engine_ms,
                "prompt_tokens": got["prompt"],
                "cached_tokens": got["cached"],
            }
        )
    return rows


CHAIN_COLUMNS = (
    ("mode", 20, "", "<"),
    ("turn", 4, "d", ">"),
    ("bytes", 8, ",", ">"),
    ("bridge ms", 9, ".3f", ">"),
    ("engine ms", 9, ".3f", ">"),
    ("prompt", 7, ",", ">"),
    ("cached", 7, ",", ">"),
)


def format_chain(chain: dict) -> str:
    """The chain's reported turns as a table: request bytes, the bridge's prompt-building ms,
    the engine's render+tokenize ms, prompt and cached tokens."""
    from clients.bench.figures import Column, table

    columns = [Column(t, w, spec, align) for t, w, spec, align in CHAIN_COLUMNS]
    rows = [
        (
            mode,
            r["turn"],
            r["request_bytes"],
            r["bridge_build_ms"],
            r["engine_render_tokenize_ms"],
            r["prompt_tokens"],
            r["cached_tokens"],
        )
        for mode, found in chain.items()
        for r in found
    ]
    head = (
        "Responses, one conversation of 40 turns: what a turn sends, and the medians of "
        f"{CHAIN_REPEATS} runs of what it costs to build"
    )
    return "\n".join([head, *table(columns, rows, "  ")])
