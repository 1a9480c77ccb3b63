"""Seeded agent traffic for `lineage bench agents`: plain Python, no MLX, no Ray.

K parallel sub-agents (lanes) share one long system prompt plus tool
definitions (about 10k estimated tokens at scale 1.0). Each lane runs
sessions back to back; a session is several user turns, each followed by
tool calls (an assistant message with `tool_calls`) and tool results of
varied size. The traffic also holds:

- a second agent kind ("variant") whose system prompt differs from the main
  one by a few tokens near its end (same tool definitions);
- a "clock" agent kind whose system prompt carries a timestamp, inside it,
  that changes every simulated minute (re-rendered on every request);
- a user who edits the last message, regenerates a reply, and retries after a
  dropped stream (a request with `drop_after` chunks: the client cancels it);
- a fresh session every few turns;
- with `message_edits` > 0, a phase ("message_edits") of sessions whose
  long message changes near its end: a user pastes a file, then re-sends it
  with a line nine tenths of the way in fixed ("edit_inside"); or a tool
  returns a long output, which the next turn sends truncated to its first
  85% ("truncate"), as an agent trims its context. What they share with what
  came before ends inside the long message;
- with `variants` > 0, a last phase ("system_variants"): sessions whose
  system prompt is the main one with one word changed three quarters of the
  way into it, a different word per session (a sub-agent told another
  target, say), so a restore inside the long system block is what they can
  share with what came before.

The traffic is a list of `RequestSpec`s ordered by step. Requests of one step
run concurrently, one per lane; a request depends on the previous request
of its session only: `Sessions` builds its messages from that request's
messages and reply, the reply appended as the model produced it.

This module knows what agent frameworks send and when; the text they send
is clients.bench.agents.agent_text's. It knows nothing about tokenizers, caches or
servers; sizes are tokenizer-free estimates (`clients.fanout.estimate_tokens`).
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field, replace

from clients.bench.agents.agent_text import (
    edit_line,
    edited_user_text,
    make_systems,
    make_tools,
    pasted_file,
    team_role,
    tool_call,
    tool_result,
    truncated,
    user_text,
)
from clients.fanout import estimate_tokens

PREFIX_TOKENS = 10_000  # system prompt + tools at scale 1.0 (estimated tokens)
TOOLS_SHARE = 0.4  # of the prefix
KINDS = ("main", "variant", "clock")
STEP_SECONDS = 20  # simulated time per step: the clock's minute changes every 3 steps
EVENTS = ("edit", "regenerate", "drop_retry")
VARIANT_PHASE = "system_variants"
VARIANT_DEPTH = 0.75  # where in the system text the changed word sits
VARIANT_WORDS = ("staging", "nightly", "canary", "sandbox", "mirror", "archive", "preview")
MESSAGE_PHASE = "message_edits"
LONG_MESSAGE_TOKENS = 3000  # a pasted file or a long tool result at scale 1.0 (estimated)
EDIT_DEPTH = 0.9  # where in the pasted file the user's fix falls
TRUNCATE_KEEP = 0.85  # how much of the long tool result the next turn keeps


@dataclass(frozen=True)
class RequestSpec:
    """One model call of the traffic.

    `base` says how its messages derive from the previous request of its
    session (see `Sessions.messages`): "new" (system + `new_messages`),
    "extend" (previous messages + the previous reply, carrying
    `reply_tool_calls`, + `new_messages`), "same" (the previous messages
    verbatim: regenerate, retry), "edit" (the previous messages with the last
    one replaced by `new_messages[0]`) or "truncate" (the previous messages with
    the last one, a tool result, replaced by `new_messages[0]`, then the previous
    reply and `new_messages[1:]`). The system message is re-rendered
    from `system` every time (the clock's timestamp changes).
    """

    rid: int
    step: int  # requests of one step run concurrently, at most one per lane
    lane: int
    session: str
    kind: str  # first | user | tool_result | edit | regenerate | retry
    system: str  # key into Traffic.systems
    base: str  # new | extend | same | edit | truncate
    new_messages: tuple = ()
    reply_tool_calls: tuple = ()
    namespace: str = ""
    max_tokens: int = 32
    drop_after: int = 0  # > 0: the client cancels after this many chunks
    phase: str = ""  # "" for the main traffic, else the phase it belongs to


@dataclass(frozen=True)
class Traffic:
    seed: int
    scale: float
    agents: int
    systems: dict  # key -> system text
    tools: tuple  # the tool definitions every request carries
    requests: tuple  # RequestSpec, ordered by (step, lane)

    def steps(self) -> list[list[RequestSpec]]:
        """The requests grouped by step, in order."""
        out: dict[int, list] = {}
        for spec in self.requests:
            out.setdefault(spec.step, []).append(spec)
        return [out[s] for s in sorted(out)]

    def summary(self) -> dict:
        """The traffic's shape, for the JSON report."""
        kinds = Counter(r.kind for r in self.requests)
        return {
            "seed": self.seed,
            "scale": self.scale,
            "agents": self.agents,
            "requests": len(self.requests),
            "steps": len(self.steps()),
            "sessions": len({r.session for r in self.requests}),
            "prefix_tokens_estimate": estimate_tokens(self.systems["main"])
            + estimate_tokens(json.dumps(list(self.tools))),
            "tools": len(self.tools),
            "kinds": dict(sorted(kinds.items())),
            "system_variants": dict(
                sorted(Counter(r.system.split("@")[0] for r in self.requests).items())
            ),
            "dropped": sum(1 for r in self.requests if r.drop_after),
        }


class Sessions:
    """Conversation state per session: the messages and reply of its latest request."""

    def __init__(self, traffic: Traffic):
        self.traffic = traffic
        self._last: dict[str, tuple[list, str]] = {}

    def previous(self, session: str) -> tuple[list, str] | None:
        """The messages and reply of the session's latest request (None: none yet)."""
        return self._last.get(session)

    def messages(self, spec: RequestSpec) -> list[dict]:
        """The full message list `spec` sends, given its session so far."""
        system = {"role": "system", "content": self.traffic.systems[spec.system]}
        if spec.base == "new":
            return [system, *spec.new_messages]
        previous, reply = self._last[spec.session]
        body = list(previous[1:])
        if spec.base == "same":
            pass
        elif spec.base == "edit":
            assert body and body[-1]["role"] == "user", spec
            body = body[:-1] + list(spec.new_messages)
        elif spec.base == "truncate":
            assert body and body[-1]["role"] == "tool", spec
            assistant = {"role": "assistant", "content": reply}
            body = body[:-1] + [spec.new_messages[0], assistant, *spec.new_messages[1:]]
        elif spec.base == "extend":
            assistant = {"role": "assistant", "content": reply}
            if spec.reply_tool_calls:
                assistant["tool_calls"] = list(spec.reply_tool_calls)
            body += [assistant, *spec.new_messages]
        else:
            raise ValueError(f"unknown base {spec.base!r} in request {spec.rid}")
        return [system, *body]

    def record(self, spec: RequestSpec, messages: list[dict], reply: str, completed: bool) -> None:
        """Remember what `spec` sent and got back; a dropped reply is not kept.

        After a dropped stream the client retries the same messages, so the
        session keeps the messages (the retry is "same") with no reply.
        """
        self._last[spec.session] = (messages, reply if completed else "")


# ------------------------------------------------------------ generation ----


def default_agents(scale: float) -> int:
    """Lanes at `scale`: 4 at 1.0, down to 2."""
    return max(2, min(4, round(4 * math.sqrt(scale))))


@dataclass
class _Builder:
    """Accumulates the requests of one lane."""

    scale: float
    lane: int
    tools: list
    max_tokens: int
    step: int
    out: list = field(default_factory=list)
    phase: str = ""

    def add(
        self, session: str, kind: str, system: str, base: str, new=(), calls=(), drop_after: int = 0
    ) -> None:
        max_tokens = self.max_tokens * (8 if drop_after else 1)
        self.out.append(
            RequestSpec(
                rid=-1,
                step=self.step,
                lane=self.lane,
                session=session,
                kind=kind,
                system=system,
                base=base,
                new_messages=tuple(new),
                reply_tool_calls=tuple(calls),
                max_tokens=max_tokens,
                drop_after=drop_after,
                phase=self.phase,
            )
        )
        self.step += 1

    def system_key(self, kind: str) -> str:
        if kind == "clock":  # re-rendered every request: the minute of this step
            return f"clock@{self.step * STEP_SECONDS // 60}"
        return kind


def _session(
    b: _Builder, rng: random.Random, index: int, turns: int, kind: str, event: str, event_turn: int
) -> None:
    """One session of lane `b.lane`: `turns` user turns with tool calls, plus one user event."""
    sid = f"a{b.lane}s{index}"
    result_size = (max(10, int(30 * b.scale)), max(20, int(2500 * b.scale)))
    for turn in range(turns):
        text = user_text(rng, b.lane, index, turn)
        user = {"role": "user", "content": text}
        first = turn == 0
        kind_ = "first" if first else "user"
        base = "new" if first else "extend"
        drop = 2 if event == "drop_retry" and turn == event_turn else 0
        b.add(sid, kind_, b.system_key(kind), base, [user], drop_after=drop)
        if turn == event_turn:
            if event == "edit":
                edited = {"role": "user", "content": edited_user_text(rng, text)}
                b.add(sid, "edit", b.system_key(kind), "edit", [edited])
            elif event == "regenerate":
                b.add(sid, "regenerate", b.system_key(kind), "same")
            else:
                b.add(sid, "retry", b.system_key(kind), "same")
        calls = rng.choices([0, 1, 2, 3], weights=[2, 4, 3, 1])[0] or int(first)
        for _ in range(calls):
            call = tool_call(rng, f"{b.lane}_{len(b.out)}", b.tools)
            lo, hi = result_size
            size = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
            result = {
                "role": "tool",
                "tool_call_id": call["id"],
                "name": call["function"]["name"],
                "content": tool_result(rng, call["function"]["name"], size),
            }
            b.add(sid, "tool_result", b.system_key(kind), "extend", [result], calls=[call])


def build_traffic(
    seed: int = 0,
    scale: float = 1.0,
    agents: int | None = None,
    variants: int = 0,
    message_edits: int = 0,
    tools_seed: int | None = None,
) -> Traffic:
    """The traffic of `agents` lanes at `scale` (1.0: ~10k-token prefix, 3 sessions of 3 turns).

    Lane 0 (the lead) starts at step 0 and the other lanes at step 1, so the
    sub-agents start together once the lead's first request is done. Session
    j of lane a is of kind KINDS[(a + j) % 3] and holds the user event
    EVENTS[(2a + j) % 3], so two lanes of two sessions hold every feature.
    Then `message_edits` long-message sessions (`_message_session`), then
    `variants` system-prompt-variant sessions (`variant_system`), three
    requests each, each phase after every request before it: one session
    starts per step (a session per lane at a time). The tool definitions come
    from `tools_seed` where given (else `seed`): traffics of different seeds
    may share one agent's tool set, as sessions of one installed agent do.
    """
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    agents = default_agents(scale) if agents is None else agents
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    root = math.sqrt(min(scale, 1.0))
    prefix = max(120, round(PREFIX_TOKENS * scale))
    sessions = max(2, round(3 * root))
    turns = max(2, round(3 * root))
    max_tokens = max(8, round(48 * root))
    tools = make_tools(int(prefix * TOOLS_SHARE), seed if tools_seed is None else tools_seed)
    body, clock = make_systems(prefix, tools, seed)
    systems = {"main": body + team_role("implementer"), "variant": body + team_role("reviewer")}
    specs: list[RequestSpec] = []
    for lane in range(agents):
        rng = random.Random(f"lane-{seed}-{lane}")
        b = _Builder(scale, lane, tools, max_tokens, step=0 if lane == 0 else 1)
        for j in range(sessions):
            event_turn = rng.randrange(turns)
            _session(
                b, rng, j, turns, KINDS[(lane + j) % 3], EVENTS[(2 * lane + j) % 3], event_turn
            )
        specs += b.out

    def phase(count: int, name: str, session) -> None:
        """`count` sessions of `session(builder, k)`, one new per step, a lane at a time."""
        start = max((r.step for r in specs), default=-1) + 1
        free = [start] * agents  # each lane's next step without a request
        for k in range(count):
            lane = k % agents
            b = _Builder(scale, lane, tools, max_tokens, max(start + k, free[lane]), phase=name)
            session(b, k)
            free[lane] = b.step
            specs.extend(b.out)

    def variant(b: _Builder, v: int) -> None:
        key = f"sysvar@{v}"
        systems[key] = variant_system(body, v) + team_role("implementer")
        _variant_session(b, random.Random(f"variant-{seed}-{v}"), v, key)

    phase(message_edits, MESSAGE_PHASE, lambda b, m: _message_session(b, seed, m))
    phase(variants, VARIANT_PHASE, variant)
    for spec in specs:
        if spec.system.startswith("clock@"):
            systems.setdefault(spec.system, clock(int(spec.system.split("@")[1])))
    specs.sort(key=lambda r: (r.step, r.lane))
    requests = tuple(_with_rid(r, i) for i, r in enumerate(specs))
    return Traffic(seed, scale, agents, systems, tuple(tools), requests)


def _message_session(b: _Builder, seed: int, m: int) -> None:
    """Long-message session m of the main agent kind: a pasted file, then the same with a line
    near its end fixed, then a next turn (even m); or a user turn, a long tool result, then a
    next turn that sends it truncated (odd m)."""
    rng = random.Random(f"message-{seed}-{m}")
    sid, size = f"m{m}", max(60, int(LONG_MESSAGE_TOKENS * b.scale))
    if m % 2 == 0:
        text = pasted_file(rng, size)
        b.add(sid, "first", "main", "new", [{"role": "user", "content": text}])
        fixed = {"role": "user", "content": edit_line(text, EDIT_DEPTH)}
        b.add(sid, "edit_inside", "main", "edit", [fixed])
        later = {"role": "user", "content": user_text(rng, b.lane, 200 + m, 1)}
        b.add(sid, "user", "main", "extend", [later])
        return
    user = {"role": "user", "content": user_text(rng, b.lane, 200 + m, 0)}
    b.add(sid, "first", "main", "new", [user])
    call = tool_call(rng, f"m{m}", b.tools)
    name = call["function"]["name"]
    output = tool_result(rng, name, size)
    result = {"role": "tool", "tool_call_id": call["id"], "name": name, "content": output}
    b.add(sid, "tool_result", "main", "extend", [result], calls=[call])
    cut = dict(result, content=truncated(output, TRUNCATE_KEEP))
    later = {"role": "user", "content": user_text(rng, b.lane, 200 + m, 1)}
    b.add(sid, "truncate", "main", "truncate", [cut, later])


def _variant_session(b: _Builder, rng: random.Random, v: int, key: str) -> None:
    """System-prompt variant session v: a user turn, a tool call and its result, a user turn."""
    sid = f"v{v}"
    user = {"role": "user", "content": user_text(rng, b.lane, 100 + v, 0)}
    b.add(sid, "first", key, "new", [user])
    call = tool_call(rng, f"v{v}", b.tools)
    result = {
        "role": "tool",
        "tool_call_id": call["id"],
        "name": call["function"]["name"],
        "content": tool_result(rng, call["function"]["name"], max(20, int(600 * b.scale))),
    }
    b.add(sid, "tool_result", key, "extend", [result], calls=[call])
    again = {"role": "user", "content": user_text(rng, b.lane, 100 + v, 1)}
    b.add(sid, "user", key, "extend", [again])


def variant_system(body: str, v: int) -> str:
    """The system text `body` with one word changed, VARIANT_DEPTH of the way into it: the
    first word of a rule line from there on becomes VARIANT_WORDS[v] (numbered past them)."""
    lines = body.split("\n")
    for k in range(int(len(lines) * VARIANT_DEPTH), len(lines)):
        words = lines[k].split(" ")
        if lines[k].startswith("- ") and len(words) > 3:
            word = VARIANT_WORDS[v % len(VARIANT_WORDS)]
            words[1] = word if v < len(VARIANT_WORDS) else f"{word}{v // len(VARIANT_WORDS)}"
            lines[k] = " ".join(words)
            return "\n".join(lines)
    raise ValueError("the system text has no rule line to vary")


def _with_rid(spec: RequestSpec, rid: int) -> RequestSpec:
    return replace(spec, rid=rid)
