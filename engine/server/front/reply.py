"""One request's reply as its client sees it: per branch, the text, the stop strings, the
log-probabilities' token text.

The model replica streams token ids (engine.runtime.events); a `Reply` turns them into
what the front end yields: each Tokens event with its text (engine.server.front.text's
TextStream, one per branch of `SamplingParams.n`) and its log-probabilities named by
their tokens' text; a stop string found cuts the event there and tells the replica to
stop that branch (`stop(index)`); a branch's Finished comes after the text held back at
its end and, when a stop string ended the text, says STOP. It knows a tokenizer and the
events; nothing of Ray, the plan or gRPC.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from engine.runtime.events import Finished, FinishReason, Tokens
from engine.runtime.requests import SamplingParams
from engine.server.front.text import TextStream


class Reply:
    """The text of every branch of one request, built as its events come."""

    def __init__(
        self, tokenizer, sampling: SamplingParams, constrained: bool, stop: Callable[[int], None]
    ):
        self.texts = [TextStream(tokenizer.detokenizer, sampling.stop) for _ in range(sampling.n)]
        self.decode = tokenizer.decode
        self.constrained = constrained  # a stop string leaves a constrained output incomplete
        self.stop = stop  # tells the replica to stop branch `index`
        self.ended = 0  # branches whose Finished came

    @property
    def finished(self) -> bool:
        """Every branch's Finished came."""
        return self.ended == len(self.texts)

    def tokens(self, event: Tokens) -> Tokens | None:
        """The tokens with their text; None once a stop string ended the branch's text (the
        replica is told to stop when it is found)."""
        text = self.texts[event.index]
        if text.stopped:
            return None
        before = text.count
        shown = text.feed(event.ids)
        logprobs = self.named(event.ids, event.logprobs)
        if text.stopped:
            self.stop(event.index)
            n = text.count - before
            return dataclasses.replace(event, ids=event.ids[:n], text=shown, logprobs=logprobs[:n])
        return dataclasses.replace(event, text=shown, logprobs=logprobs)

    def end(self) -> bool:
        """A branch's Finished came; whether it was the last."""
        self.ended += 1
        return self.finished

    def finish(self, event: Finished) -> list:
        """A branch's last events: the text held back at its end (no stop string ended it),
        then its Finished (reason STOP, its tokens up to that string, when one did)."""
        text = self.texts[event.index]
        tail = text.close()
        out = [Tokens(ids=(), text=tail, index=event.index)] if tail else []
        if text.stopped:
            event = dataclasses.replace(
                event,
                finish_reason=FinishReason.STOP,
                completion_tokens=min(event.completion_tokens, text.count),
                incomplete=event.incomplete or self.constrained,
                stop_sequence=text.stop_sequence,
            )
        return [*out, event]

    def named(self, ids: tuple, logprobs: tuple) -> tuple:
        """The log-probabilities with their tokens' text (each token decoded alone)."""
        if not logprobs:
            return ()
        return tuple(
            dataclasses.replace(
                lp, token=self.decode([t]), top_tokens=tuple(self.decode([i]) for i, _ in lp.top)
            )
            for t, lp in zip(ids, logprobs)
        )
