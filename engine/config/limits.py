"""The input limits: bounds on what a client sends, as operator settings.

`Limits` is one branch of the configuration tree (`EngineConfig.limits`), each
limit a setting declared beside its field (a flag `--max-...`, a variable
`LINEAGE_MAX_...`; sizes take 4M, 256K). It checks its own values;
engine.server.security.limits checks requests against them, the bridge its bodies. It
knows nothing of where a limit is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from engine.config.declare import label_of, setting
from engine.config.units import parse_bytes

CACHE_BLOCK = 64  # tokens: the grain of cached-token figures sent to clients
MAX_REQUEST_BYTES = (1 << 31) - 1 - (1 << 20)  # gRPC's message cap, less the band above it
MAX_JSON_DEPTH = 512  # the JSON parser and the chat template recurse this deep


@dataclass(frozen=True)
class Limits:
    """Limits on client input (why these defaults: engine/server/security/limits.py)."""

    max_stop_strings: int = setting(16, "stop strings per request")
    max_stop_length: int = setting(256, "characters per stop string")
    max_stop_token_ids: int = setting(64, "stop token ids per request")
    max_request_bytes: int = setting(4 << 20, "a whole serialized gRPC request", parse=parse_bytes)
    max_tools_bytes: int = setting(256 << 10, "a request's tools_json text", parse=parse_bytes)
    max_json_depth: int = setting(32, "nesting of tools_json and tool-call arguments")
    max_id_length: int = setting(128, "characters of a request_id or a namespace")
    max_messages: int = setting(4096, "messages per request")
    max_n: int = setting(8, "branches per request (n): each is a sequence of the batch")
    max_body_bytes: int = setting(
        4 << 20,
        "an HTTP body at the OpenAI bridge (never more than --max-request-bytes)",
        parse=parse_bytes,
    )
    max_memo_bytes: int = setting(
        32 << 20,
        "the anchor memo: rendered (system + tools) texts and their ids",
        parse=parse_bytes,
    )

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{label_of(Limits, f.name)} must be a positive integer, got {value!r}"
                )
        if self.max_request_bytes > MAX_REQUEST_BYTES:
            raise ValueError(
                f"{label_of(Limits, 'max_request_bytes')} must be at most {MAX_REQUEST_BYTES} "
                f"(gRPC's 2 GiB message cap), got {self.max_request_bytes}"
            )
        if self.max_json_depth > MAX_JSON_DEPTH:
            raise ValueError(
                f"{label_of(Limits, 'max_json_depth')} must be at most {MAX_JSON_DEPTH} (the "
                f"JSON parser and the chat template recurse that deep), got {self.max_json_depth}"
            )
