"""The state machine that reads a completion's text, fed as it streams, into parts,
for one family's `Markup` (clients.bridge.markups).

Text outside markup is text, between the reasoning markers reasoning; a call's
opener starts its body, which the family's streamer reads as it grows and its reader
when the closer (or the output's end) comes. Markup never reaches a TextPart: a
marker split across feeds at any position is held back until it is whole, or until
the output ends and shows it was text after all. The contract of the parts it
answers is clients.bridge.parsers'.

It knows markers and the order of parts; it knows no family by name and no call
body's syntax (the Markup's readers and streamers do). Plain Python, no MLX.
"""

import re
from typing import Mapping

from clients.bridge import call_streams as streams
from clients.bridge.calls import Call
from clients.bridge.markups import Markup
from clients.bridge.parts import Part, ReasoningPart, TextPart, ToolCallEnd

_TEXT, _REASONING, _SECTION, _CALL = "text", "reasoning", "section", "call"
_NAME_FIRST = re.compile(r"[\w.-]*\w(\n|$)")  # a call after the prompt's tail: its name first


class OutputParser:
    """A completion's text, fed as it streams, as parts (see the module docstring).

    Invariant: with no markup in the text, the TextParts of every feed plus
    close() join to exactly the text fed, however it was split.
    """

    def __init__(self, markup: Markup, reasoning: bool = False, tools=None):
        self.markup = markup
        self.tools = tools
        self.state = _REASONING if reasoning and markup.think else _TEXT
        self.held = markup.prompt_tail  # fed text not handled yet: it may end with part of a marker
        self.space = ""  # whitespace at the end of the text or reasoning, held
        self.lead = self.call_lead = ""  # the whitespace before the last marker, the call's
        self.strip = self.state == _REASONING  # drop leading whitespace (after a marker)
        self.opened = reasoning  # the template opened the reasoning: a leading <think> repeats it
        self.in_section = False
        self.opener = ""  # the open call's marker
        self.shown = ""  # what of it the model wrote ("" for the generation prompt's tail)
        self.tail = markup.prompt_tail  # the generation prompt's tail, not yet acted on
        self.body = ""  # the open call's text
        self.index = 0  # calls that parsed
        self.streamed = streams.Streamed()  # the open call's calls that went out
        self.at_start = bool(markup.lead) and self.state == _TEXT  # a lead may open a call
        self.at_message = True  # at the output's start or after a call_at marker
        self.closing = False

    def feed(self, text: str) -> list[Part]:
        self.held += text
        out: list[Part] = []
        while self._step(out):
            pass
        return _merged(out)

    def close(self) -> list[Part]:
        """The parts the end of the output settles: held text, an unterminated call."""
        out: list[Part] = []
        self.closing = True  # a marker that a longer one may have continued is whole now
        while self._step(out):
            pass
        rest, self.held = self.held, ""
        if self.state == _CALL:
            self.body += rest
            # a call its marker opened and the output's end cut (max_tokens, a stop string)
            # is markup, not text: when it does not parse it is dropped (raw ""); a call
            # that opened without a marker (a lead) was text after all; one the prompt's
            # tail opened is cut where it began like a call (a name), else it was text
            cut = bool(self.shown) or (
                self.opener != self.shown and _NAME_FIRST.match(self.body) is not None
            )
            self._end_call(out, "" if cut else self.shown + self.body, keep_lead=not cut)
        elif self.state == _SECTION:
            pass  # between calls: what is held is the start of a marker, not text
        elif self.state == _REASONING:
            self._content(rest, ReasoningPart, out)
        else:
            self._content(rest, TextPart, out)
            if self.state == _TEXT and self.space:
                out.append(TextPart(self.space))
        self.space = ""
        return _merged(out)

    # -- the state machine ---------------------------------------------------

    def _markers(self) -> dict[str, str]:
        """Marker -> what it does, in the current state."""
        m, out = self.markup, {}
        if self.state == _TEXT:
            if m.think:
                out[m.think[0]] = "think"
                out[m.think[1]] = "drop"  # a stray closer is markup too
            if m.call:
                if m.call_at is None or self.at_message:
                    out[m.call[0]] = "call"
                if m.call[1] and m.call[1] != m.call[0]:
                    out[m.call[1]] = "drop"
            if m.section:
                out[m.section[0]] = "section"
                out[m.section[1]] = "drop"
            for marker in m.drop:
                out.setdefault(marker, "drop")
            if m.code_call:
                out[m.code_call[0]] = "call"
        elif self.state == _REASONING:
            out[m.think[1]] = "text"
            if self.opened:
                out[m.think[0]] = "reopen"
        elif self.state == _SECTION:
            out[m.call[0]] = "call"
            out[m.section[1]] = "text"
        elif m.call[1] and not self._code():
            out[m.call[1]] = "end"
        return out

    def _code(self) -> bool:
        """Whether the open call is the family's code call (Markup.code_call)."""
        return (
            bool(self.opener)
            and self.markup.code_call is not None
            and (self.opener == self.markup.code_call[0])
        )

    def _step(self, out: list[Part]) -> bool:
        """Handle the held text up to the next marker; False when none is whole yet."""
        if self.at_start:
            return self._lead()
        markers = self._markers()
        found = [(self.held.find(k), -len(k), k) for k in markers]
        found = [f for f in found if f[0] >= 0]
        if not found:
            keep = _partial(self.held, markers)
            self._handle(self.held[: len(self.held) - keep], out)
            self.held = self.held[len(self.held) - keep :]
            return False
        at, _, marker = min(found)
        rest = self.held[at:]
        if not self.closing and any(len(k) > len(rest) and k.startswith(rest) for k in markers):
            # a longer marker (` to=self<|message|>` beside ` to=`) may still come whole
            self._handle(self.held[:at], out)
            self.held = rest
            return False
        self._handle(self.held[:at], out)
        self.held = self.held[at + len(marker) :]
        self._act(markers[marker], marker, out)
        return True

    def _lead(self) -> bool:
        """At the output's start, a call that opens without a marker (Llama 3's JSON,
        pythonic lists) or not; False while only whitespace has come."""
        rest = self.held.lstrip()
        if not rest:
            return False
        self.at_start = False
        if rest[0] in self.markup.lead:
            self.call_lead, self.held = self.held[: len(self.held) - len(rest)], rest
            self.state, self.opener, self.body, self.in_section = _CALL, "", "", False
        return True

    def _handle(self, text: str, out: list[Part]) -> None:
        if not text:
            return
        if self.state == _CALL:
            self.body += text
            self._stream(out)
        elif self.state == _REASONING:
            self.opened = self.opened and not text.strip()
            self._content(text, ReasoningPart, out)
        elif self.state == _SECTION:
            if text.strip():  # not markup, so it is text
                out.append(TextPart(text))
        else:
            self.at_message = self.at_message and not text.strip()
            self._content(text, TextPart, out)

    def _act(self, action: str, marker: str, out: list[Part]) -> None:
        # Whitespace beside markup is layout; before a call it is kept aside, the call's
        # if it does not parse (then its raw text is returned as it was written).
        self.lead, self.space = self.space, ""
        self.at_message = marker in (self.markup.call_at or ())
        tail, self.tail = self.tail, ""  # only the first marker can be the prompt's tail
        if action == "think":
            self.state, self.strip = _REASONING, True
        elif action == "call":
            self.in_section = self.state == _SECTION
            self.state, self.opener, self.body = _CALL, marker, ""
            self.shown = "" if tail == marker else marker
            self.call_lead = self.lead
        elif action == "section":
            self.state = _SECTION
        elif action == "end":
            reopen = self.markup.closer_opens  # the closer opens the next message too
            parsed = self._end_call(out, self.shown + self.body + ("" if reopen else marker))
            self.state = _SECTION if self.in_section else _TEXT
            if reopen:
                self.held = marker + self.held
            if not parsed:  # its text stands as written, the whitespace after it too
                self.strip = False
                return
        elif action == "text":
            self.state = _TEXT
        self.strip = True
        if action == "reopen":
            self.opened = False

    def _content(self, text: str, kind, out: list[Part]) -> None:
        """Text or reasoning, its leading whitespace dropped after a marker and its
        trailing whitespace held until more comes (markup may follow it)."""
        if self.strip:
            text = text.lstrip()
            if not text:
                return
            self.strip = False
        text = self.space + text
        body = text.rstrip()
        self.space = text[len(body) :]
        if body:
            out.append(kind(body))

    def _stream(self, out: list[Part]) -> None:
        """The open call's settled calls and arguments. A call its marker opened streams
        once its name is whole; one opened without a marker (a lead: it may yet be text)
        once its first call names a tool of the request."""
        stream = self.markup.code_call[2] if self._code() else self.markup.stream
        if stream is None:
            return
        known = stream(self.body, self.tools)
        if self.opener or self.streamed.calls or (known and known[0].name in self._names()):
            self.index = self.streamed.grow(known, self.index, out)

    def _names(self) -> set[str]:
        """The request's tool names."""
        fns = (t.get("function", t) for t in self.tools or () if isinstance(t, Mapping))
        return {f.get("name") for f in fns if isinstance(f, Mapping)}

    def _end_call(self, out: list[Part], raw: str, keep_lead: bool = True) -> bool:
        """The open call's parts; False when it does not parse and nothing of it was
        streamed (one ToolCallEnd, its raw text with the whitespace before it)."""
        parse = self.markup.code_call[1] if self._code() else self.markup.parse
        calls = parse(self.body, self.tools) if parse else None
        if isinstance(calls, Call):
            calls = [calls]
        if not calls and not self.streamed.calls:
            out.append(ToolCallEnd(self.index, None, self.call_lead + raw if keep_lead else raw))
            return False
        self.index = self.streamed.end(calls or [], raw or self.opener + self.body, self.index, out)
        return True


def _partial(text: str, markers) -> int:
    """Length of the longest end of `text` that begins one of `markers` (held back)."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


def _merged(parts: list[Part]) -> list[Part]:
    """Adjacent text parts joined, adjacent reasoning parts joined."""
    out: list[Part] = []
    for p in parts:
        if out and type(p) is type(out[-1]) and isinstance(p, (TextPart, ReasoningPart)):
            out[-1] = type(p)(out[-1].text + p.text)
        else:
            out.append(p)
    return out
