"""A request's completion text, made in the front end from the token ids the model sends.

The model loop emits token ids only (the busy loop computes and samples).
Here each request's ids become text through the tokenizer's streaming
detokenizer, and its stop strings are watched: text that may begin
one is held back until decided, and a stop string ends the text at its start
(the model is then told to stop; the tokens it decoded meanwhile are not
shown). A reply's first space is kept: mlx-lm's byte-level BPE detokenizer
drops it (`_maybe_trim_space`), which loses a column of indentation in code and
the space an OpenAI completion keeps (" Paris"); Hugging Face's decode keeps it.
It knows a detokenizer and strings; nothing of the model, Ray or gRPC.
"""

from __future__ import annotations

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer


class SpaceKeepingDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's byte-level BPE detokenizer that keeps the first token's leading space."""

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text


def keeping_spaces(detokenizer):
    """The same detokenizer, its state included, without the first space's trim (one of
    mlx-lm's byte-level BPE detokenizers only: other kinds' trims are their tokenizer's)."""
    if type(detokenizer) is BPEStreamingDetokenizer:
        detokenizer.__class__ = SpaceKeepingDetokenizer
    return detokenizer


class StopMatcher:
    """Finds the first stop string in streamed text, holding back a possible prefix.

    `feed(text)` returns (text safe to emit, stopped). Text that could be the
    start of a stop string is held until it is decided.
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.matched = ""  # the stop string found (the first in the text; the longest there)

    def feed(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        buf = self.pending + text
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            at = min(h[0] for h in hits)
            self.matched = max((s for i, s in hits if i == at), key=len)
            self.pending = ""
            return buf[:at], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        self.pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class TextStream:
    """One request's completion: its ids, their text, and its stop strings."""

    def __init__(self, detokenizer, stop: tuple[str, ...] = ()):
        """`detokenizer`: a streaming detokenizer of this request's own (mlx-lm's
        `TokenizerWrapper.detokenizer` hands out a fresh one each time)."""
        self.count = 0  # ids taken in, up to the one that completed a stop string
        self.stopped = False
        self._detokenizer = keeping_spaces(detokenizer)
        self._stop = StopMatcher(stop)

    def feed(self, ids) -> str:
        """The text of more ids that is safe to show. Once a stop string ends the text
        (`stopped`), the rest is ignored: `count` is the ids up to the one that completed it."""
        if self.stopped:
            return ""
        if not self._stop.stops:  # no stop string: the step's ids at once
            for token in ids:
                self._detokenizer.add_token(token)
            self.count += len(ids)
            return self._detokenizer.last_segment
        out = []
        for token in ids:
            self.count += 1
            self._detokenizer.add_token(token)
            text, self.stopped = self._stop.feed(self._detokenizer.last_segment)
            out.append(text)
            if self.stopped:
                break
        return "".join(out)

    @property
    def stop_sequence(self) -> str:
        """The stop string that ended the text ("" while none has)."""
        return self._stop.matched

    def close(self) -> str:
        """The text held back at the end of a completion no stop string ended (the
        detokenizer's last piece, a prefix of a stop string)."""
        if self.stopped:
            return ""
        self._detokenizer.finalize()
        return self._stop.feed(self._detokenizer.last_segment)[0] + self._stop.flush()
