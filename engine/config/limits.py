"""The input limits: bounds on what a client sends, as operator settings.

`Limits` is one branch of the configuration tree (`EngineConfig.limits`,
built by `EngineConfig.from_sources` from `--max-...` flags and
`LINEAGE_MAX_...` variables). It checks its own values; engine.server.limits
checks requests against them, the bridge its bodies. It knows nothing of
where a limit is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

CACHE_BLOCK = 64  # tokens: the grain of cached-token figures sent to clients
MAX_REQUEST_BYTES = (1 << 31) - 1 - (1 << 20)  # gRPC's message cap, less the band above it
MAX_JSON_DEPTH = 512  # the JSON parser and the chat template recurse this deep


@dataclass(frozen=True)
class Limits:
    """Bounds on what a client sends (engine.server.limits checks them, the bridge the
    body). Each is a flag `--max-...` with a variable `LINEAGE_MAX_...`; sizes take 4M,
    256K. Why these defaults: engine/server/limits.py."""

    max_stop_strings: int = 16
    max_stop_length: int = 256  # characters per stop string
    max_stop_token_ids: int = 64
    max_request_bytes: int = 4 << 20  # a whole serialized gRPC request
    max_tools_bytes: int = 256 << 10  # tools_json text
    max_json_depth: int = 32  # tools_json and tool-call arguments
    max_id_length: int = 128  # request_id and namespace
    max_messages: int = 4096
    max_body_bytes: int = 16 << 20  # an HTTP body at the OpenAI bridge
    max_memo_bytes: int = 32 << 20  # the anchor memo: rendered (system + tools) texts, ids

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag_name(f.name)} must be a positive integer, got {value!r}")
        if self.max_request_bytes > MAX_REQUEST_BYTES:
            raise ValueError(
                f"--max-request-bytes must be at most {MAX_REQUEST_BYTES} (gRPC's 2 GiB message "
                f"cap), got {self.max_request_bytes}"
            )
        if self.max_json_depth > MAX_JSON_DEPTH:
            raise ValueError(
                f"--max-json-depth must be at most {MAX_JSON_DEPTH} (the JSON parser and the "
                f"chat template recurse that deep), got {self.max_json_depth}"
            )


def flag_name(name: str) -> str:
    """The CLI flag of a setting: max_stop_strings -> --max-stop-strings."""
    return "--" + name.replace("_", "-")
