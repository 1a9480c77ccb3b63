"""The users of a soak: agent-shaped clients of the bridge over HTTP, and what they saw.

Three kinds of user run on threads of their own until the soak ends, each
request streamed over HTTP in one of the three wire formats (chat completions,
Anthropic Messages, Responses chained by `previous_response_id`), the shapes
and readers of clients.bench.agents.wire_apis:

- `Rounds`: sub-agents in bursts. Round after round, one seeded agent traffic
  of clients.bench.agents.traffic (a lead, then sub-agents together on their
  own system prompts, tool calls, edits, regenerates, dropped streams and
  their retries), each round new sessions on a new seed, each session in the
  wire format its name picks; between steps, now and then an idle gap. The
  rounds' tool definitions come from a few sets in turn (`tool_sets`: the
  agents one machine has installed), so the tool grammars the engine compiles
  recur, as on a user's machine (the soak keeps fewer than that compiled, so
  they are also dropped and compiled again); 0 makes every round's tools new.
- `LongSession`: one coding session that grows turn by turn (user turns, tool
  calls and results), and compacts when it passes `compact_at` estimated
  tokens (it starts again from its system prompt and a summary); now and then
  a regenerate, an edit of the last turn, a cancelled stream, a slow reader
  (a pause between events) or an idle gap.
- the probes (`probe`): fixed requests, greedy, through the gRPC client, whose
  token ids are compared with the first reply each got.

Every request ends in `Log.add`: when, its kind, the client's time to first
token (request sent to first content), prompt and cached tokens, and the error
(HTTP status and the error's type, or the transport's failure) if it failed.
It knows nothing about faults: an error during a restart is recorded as any
other, and the report tells them apart by time.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from clients.bench.agents import wire_apis
from clients.fanout import estimate_tokens

APIS = wire_apis.APIS


@dataclass
class Event:
    t: float  # seconds since the soak began, when the request ended
    user: str
    api: str
    kind: str
    ttft_ms: float = 0.0
    prompt: int = 0
    cached: int = 0
    error: str = ""  # "" | "http <status> <type>" | "transport <exception>" | ...
    message: str = ""  # the error's message ("" for none: an unclean error)
    dropped: bool = False


class Log:
    """Every request's Event, appended from every user's thread."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def since(self, t: float) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.t >= t]


@dataclass
class Reply:
    text: str = ""
    completed: bool = False
    response_id: str | None = None
    event: Event | None = None


def send(http, log: Log, user: str, api: str, kind: str, body: dict, **how) -> Reply:
    """POST one streamed request in wire format `api`; its reply, recorded in `log`.
    `how`: drop_after (cancel after that many content events), pause (seconds between
    events read: a slow reader)."""
    import httpx

    ev = Event(0.0, user, api, kind)
    out = Reply(event=ev)
    t0 = time.perf_counter()
    try:
        with http.stream("POST", wire_apis.PATHS[api], json=body) as reply:
            if reply.status_code != 200:
                ev.error, ev.message = _http_error(reply)
            else:
                t_headers = time.perf_counter()
                got = wire_apis.read_stream(api, reply, how.get("drop_after", 0), how.get("pause"))
                ev.ttft_ms = (t_headers - t0) * 1000 + got["ttft_ms"]
                ev.prompt, ev.cached = got["prompt"], got["cached"]
                ev.dropped = bool(how.get("drop_after")) and not got["completed"]
                out.text, out.completed = got["text"], got["completed"]
                out.response_id = got["response_id"]
                if not got["completed"] and not ev.dropped:
                    ev.error, ev.message = "stream ended early", got.get("error", "")
    except httpx.HTTPError as e:  # the server down (a restart): try again a second later
        ev.error, ev.message = f"transport {type(e).__name__}", str(e)
        time.sleep(1.0)
    except Exception as e:  # a reply we could not read: counted, never hidden
        ev.error, ev.message = f"client {type(e).__name__}", str(e)
    ev.t = log.now()
    log.add(ev)
    return out


def _http_error(reply) -> tuple[str, str]:
    raw = reply.read()
    try:
        body = __import__("json").loads(raw)
        err = body.get("error", body)
        kind = err.get("type") or err.get("code") or "?"
        return f"http {reply.status_code} {kind}", str(err.get("message", ""))
    except Exception:
        return f"http {reply.status_code} unparsed", raw[:200].decode(errors="replace")


def api_of(name: str) -> str:
    """The wire format a session speaks, picked by its name (stable across runs)."""
    return APIS[zlib.crc32(name.encode()) % len(APIS)]


def body_for(api: str, chains, session: str, messages: list, tools, max_tokens: int) -> dict:
    if api == "responses":
        return chains.body(session, messages, list(tools), max_tokens)

    class Spec:  # the fields the chat and messages bodies read
        pass

    spec = Spec()
    spec.max_tokens = max_tokens
    make = wire_apis.chat_body if api == "chat" else wire_apis.messages_body
    return make(messages, list(tools), spec)


class User(threading.Thread):
    """A user on a thread of its own, until `halt` is set."""

    def __init__(self, name: str, url: str, log: Log, halt: threading.Event, seed: int):
        super().__init__(name=name, daemon=True)
        self.url, self.log, self.halt = url, log, halt
        self.rng = random.Random(f"{name}-{seed}")
        self.requests = 0

    def idle(self, p: float, lo: float, hi: float) -> None:
        """With probability p, an idle gap of lo..hi seconds (a user reading, a laptop asleep)."""
        if self.rng.random() < p:
            self.halt.wait(self.rng.uniform(lo, hi))

    def run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=600) as http:
            while not self.halt.is_set():
                self.once(http)

    def once(self, http) -> None:
        raise NotImplementedError


class Rounds(User):
    """Rounds of seeded agent traffic: a lead, then its sub-agents in a burst."""

    def __init__(
        self,
        url,
        log,
        halt,
        seed: int,
        scale: float,
        agents: int,
        max_tokens: int,
        tool_sets: int = 0,
    ):
        super().__init__("rounds", url, log, halt, seed)
        self.seed, self.scale, self.agents, self.max_tokens = seed, scale, agents, max_tokens
        self.tool_sets = tool_sets
        self.round = 0

    def tools_seed(self) -> int:
        """The seed of this round's tool set: one of `tool_sets` in turn (the agents one
        machine has installed), or the round's own where `tool_sets` is 0."""
        if self.tool_sets <= 0:
            return self.seed + self.round
        return self.seed + self.round % self.tool_sets

    def once(self, http) -> None:
        from clients.bench.agents.traffic import Sessions, build_traffic

        traffic = build_traffic(
            seed=self.seed + self.round,
            scale=self.scale,
            agents=self.agents,
            tools_seed=self.tools_seed(),
        )
        sessions, chains = Sessions(traffic), wire_apis.Chains()
        tag = f"r{self.round}"
        with ThreadPoolExecutor(max(1, traffic.agents)) as pool:
            for step in traffic.steps():
                if self.halt.is_set():
                    return
                futures = [
                    pool.submit(self._one, http, traffic, sessions, chains, tag, s) for s in step
                ]
                for spec, f in zip(step, futures):
                    messages, reply = f.result()
                    sessions.record(spec, messages, reply.text, reply.completed)
                self.idle(0.05, 1.0, 6.0)
        self.round += 1

    def _one(self, http, traffic, sessions, chains, tag, spec):
        messages = sessions.messages(spec)
        session = f"{tag}-{spec.session}"
        api = api_of(session)
        body = body_for(api, chains, session, messages, traffic.tools, self.max_tokens)
        body["max_tokens" if api != "responses" else "max_output_tokens"] = spec.max_tokens
        pause = 0.05 if self.rng.random() < 0.1 else None  # a slow reader now and then
        reply = send(
            http, self.log, self.name, api, spec.kind, body, drop_after=spec.drop_after, pause=pause
        )
        self.requests += 1
        if reply.completed:
            chains.record(session, messages, reply.text, reply.response_id)
        return messages, reply


class LongSession(User):
    """One coding session growing turn by turn, compacted past `compact_at` tokens."""

    def __init__(
        self, index: int, url, log, halt, seed: int, scale: float, max_tokens: int, compact_at: int
    ):
        super().__init__(f"long-{index}", url, log, halt, seed)
        from clients.bench.agents.agent_text import make_systems, make_tools, team_role

        prefix = max(120, round(10_000 * scale))
        self.tools = make_tools(int(prefix * 0.4), seed + 1000 + index)
        body, _ = make_systems(prefix, self.tools, seed + 1000 + index)
        self.system = body + team_role("implementer")
        self.api = APIS[index % len(APIS)]
        self.max_tokens, self.compact_at, self.scale = max_tokens, compact_at, scale
        self.index = index
        self.chains = wire_apis.Chains()
        self.compactions = 0
        self.turn = 0
        self.messages = [{"role": "system", "content": self.system}]
        self.session = f"{self.name}-c0"

    def once(self, http) -> None:
        from clients.bench.agents.agent_text import tool_call, tool_result, user_text

        self.turn += 1
        rng = self.rng
        if estimate_tokens(str(self.messages)) > self.compact_at:
            self._compact()
        self.messages.append(
            {"role": "user", "content": user_text(rng, self.index, self.compactions, self.turn)}
        )
        roll = rng.random()
        kind, how = "user", {}
        if roll < 0.08:
            kind, how = "cancelled", {"drop_after": 2}
        elif roll < 0.16:
            kind, how = "slow_reader", {"pause": 0.1}
        reply = self._send(http, kind, **how)
        if kind == "cancelled":  # the user sends it again
            reply = self._send(http, "retry")
        if rng.random() < 0.08:  # regenerate: the same messages again
            reply = self._send(http, "regenerate")
        elif rng.random() < 0.08:  # edit the last turn, send again
            text = self.messages[-1]["content"]
            self.messages[-1] = {"role": "user", "content": text + " Also keep the old API."}
            reply = self._send(http, "edit")
        if not reply.completed:
            self.messages.pop()  # the turn is lost: the user types another
            return
        calls = [tool_call(rng, f"{self.name}_{self.turn}_{k}", self.tools) for k in range(2)]
        calls = calls[: rng.choice([0, 1, 1, 2])]
        self.messages.append(
            {"role": "assistant", "content": reply.text, **({"tool_calls": calls} if calls else {})}
        )
        for call in calls:
            name = call["function"]["name"]
            size = int(rng.uniform(20, max(40, 1500 * self.scale)))
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": name,
                    "content": tool_result(rng, name, size),
                }
            )
        if calls:  # the agent answers the tool results at once
            self.messages.append({"role": "user", "content": "Go on."})
            reply = self._send(http, "tool_result")
            if reply.completed:
                self.messages.append({"role": "assistant", "content": reply.text})
            else:
                self.messages.pop()
        self.idle(0.15, 0.5, 4.0)
        self.idle(0.01, 10.0, 30.0)  # the laptop sleeps

    def _send(self, http, kind: str, **how) -> Reply:
        body = body_for(
            self.api, self.chains, self.session, self.messages, self.tools, self.max_tokens
        )
        reply = send(http, self.log, self.name, self.api, kind, body, **how)
        self.requests += 1
        if reply.completed:
            self.chains.record(self.session, self.messages, reply.text, reply.response_id)
        return reply

    def _compact(self) -> None:
        """Start again from the system prompt and a summary of the session so far."""
        self.compactions += 1
        said = [m["content"] for m in self.messages if m["role"] == "assistant" and m["content"]]
        summary = " ".join(said[-4:])[:1200]
        text = f"Summary of the work so far (compacted {self.compactions}): {summary}"
        self.messages = [self.messages[0], {"role": "user", "content": text}]
        self.messages.append({"role": "assistant", "content": "Understood, continuing."})
        self.session = f"{self.name}-c{self.compactions}"


# ---- probes ------------------------------------------------------------------------------


PROBES = (
    "Name three prime numbers and explain why each is prime.",
    "Write a haiku about a cache that never forgets.",
    "List the steps to reverse a linked list in place.",
)


@dataclass
class Probes:
    """Fixed greedy requests; each reply's token ids against the first it got."""

    max_tokens: int = 16
    reference: dict = field(default_factory=dict)  # probe -> token ids
    checked: int = 0
    wrong: list = field(default_factory=list)  # {t, probe, got, want}
    failed: list = field(default_factory=list)  # {t, probe, error}

    def run(self, client, log: Log) -> None:
        from clients.client import LineageError

        for k, text in enumerate(PROBES):
            messages = [{"role": "user", "content": text}]
            try:
                ids = client.generate(
                    messages=messages, max_tokens=self.max_tokens, temperature=0.0
                ).token_ids
            except LineageError as e:
                self.failed.append({"t": log.now(), "probe": k, "error": f"{e.code}: {e}"})
                continue
            ids = list(ids)
            want = self.reference.setdefault(k, ids)
            self.checked += 1
            if ids != want:
                self.wrong.append({"t": log.now(), "probe": k, "got": ids, "want": want})
