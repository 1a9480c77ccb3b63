"""The cache's vocabularies: restore kinds, checkpoint kinds, capture kinds, entry roles.

String-valued enums: each member equals its string (`RestoreKind.ANCHOR ==
"anchor"`), so they cross Ray, JSON, entry-file headers and the gRPC API as
plain strings, and a string read back from any of those converts with
`RestoreKind(text)` (ValueError for an unknown one). One definition each;
every other module imports them from here.
"""

from __future__ import annotations

from enum import Enum


class TextEnum(str, Enum):
    """A str-valued enum whose str() and format() are its value."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class RestoreKind(TextEnum):
    """How a request's cached prefix was restored.

    ENTRY: an entry's full length (the whole entry was a prefix of the prompt);
    the others name the checkpoint (or anchor entry) that served it; NONE: cold.
    """

    ENTRY = "entry"
    GUARD = "guard"
    FINAL = "final"
    ANCHOR = "anchor"
    DIVERGENCE = "divergence"
    REPLY = "reply"
    MESSAGE = "message"
    SYSTEM = "system"
    NONE = "none"


class CheckpointKind(TextEnum):
    """Why a checkpoint exists (its event); also the restore kind it serves.

    GUARD: prompt minus 16, for a verbatim resend; FINAL: a turn boundary
    carried over when an entry is absorbed; ANCHOR: an anchor entry's own
    state; DIVERGENCE: where a prompt left its closest sibling; REPLY: the
    prompt end kept when an entry extends over its reply; MESSAGE: a point
    inside a long message after the system block, where an edit or a
    truncation inside it restores; SYSTEM: a point inside the long (system +
    tools) block, where another session's variant of it restores
    (engine.cache.message_points places both).
    """

    GUARD = "guard"
    FINAL = "final"
    ANCHOR = "anchor"
    DIVERGENCE = "divergence"
    REPLY = "reply"
    MESSAGE = "message"
    SYSTEM = "system"


class CaptureKind(TextEnum):
    """A capture point a plan asks the model actor to take during prefill.

    SNAPSHOT: exact mode's prompt-minus-16 whole-prompt entry.
    """

    GUARD = "guard"
    ANCHOR = "anchor"
    DIVERGENCE = "divergence"
    SNAPSHOT = "snapshot"
    MESSAGE = "message"
    SYSTEM = "system"


class MissKind(TextEnum):
    """Why a request restored less than an earlier prompt of its namespace offered
    (engine.cache.misses).

    SYSTEM: a system message changed; TOOLS: the tools changed; HISTORY: an
    earlier message was edited (or dropped); TEMPLATE: the messages are the
    same but the chat template rendered them to other tokens (a past reply
    re-rendered otherwise than it was generated, a date in the template);
    EVICTED: the prompt continues an earlier one whose cache is gone.
    """

    SYSTEM = "system"
    TOOLS = "tools"
    HISTORY = "history"
    TEMPLATE = "template"
    EVICTED = "evicted"


class Role(TextEnum):
    """What an entry is for.

    CONVERSATION: one per lineage (lineage mode); ANCHOR: the pinned (system +
    tools) prefix, an entry of its own; SNAPSHOT: exact mode's whole prompts.
    """

    CONVERSATION = "conversation"
    ANCHOR = "anchor"
    SNAPSHOT = "snapshot"
