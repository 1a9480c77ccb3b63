from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    reasoning_content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ..., reasoning_content: _Optional[str] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "seed", "max_tokens", "stop", "stop_token_ids", "logprobs", "top_logprobs", "n")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: bool
    top_logprobs: int
    n: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., n: _Optional[int] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "lark", "tool_choice", "strict")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    LARK_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    lark: str
    tool_choice: ToolChoice
    strict: bool
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., lark: _Optional[str] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., strict: _Optional[bool] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "name", "single")
    MODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SINGLE_FIELD_NUMBER: _ClassVar[int]
    mode: str
    name: str
    single: bool
    def __init__(self, mode: _Optional[str] = ..., name: _Optional[str] = ..., single: _Optional[bool] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "namespace", "messages", "tools_json", "prompt_ids", "prompt_text", "sampling", "add_generation_prompt", "continue_final_message", "session", "constraint", "model", "cache_marks", "template_kwargs_json")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CACHE_MARKS_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    namespace: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    tools_json: str
    prompt_ids: TokenIds
    prompt_text: str
    sampling: Sampling
    add_generation_prompt: bool
    continue_final_message: bool
    session: str
    constraint: Constraint
    model: str
    cache_marks: _containers.RepeatedScalarFieldContainer[int]
    template_kwargs_json: str
    def __init__(self, request_id: _Optional[str] = ..., namespace: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., tools_json: _Optional[str] = ..., prompt_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., prompt_text: _Optional[str] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., add_generation_prompt: _Optional[bool] = ..., continue_final_message: _Optional[bool] = ..., session: _Optional[str] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., model: _Optional[str] = ..., cache_marks: _Optional[_Iterable[int]] = ..., template_kwargs_json: _Optional[str] = ...) -> None: ...

class PrefillProgress(_message.Message):
    __slots__ = ("done", "total")
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    done: int
    total: int
    def __init__(self, done: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs", "token", "top_tokens")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    token: str
    top_tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ..., token: _Optional[str] = ..., top_tokens: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("ids", "text", "logprobs", "index")
    IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    index: int
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., index: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "cached_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class Restore(_message.Message):
    __slots__ = ("kind", "length")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    kind: str
    length: int
    def __init__(self, kind: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_ms", "plan_ms", "restore_ms", "prefill_ms", "commit_ms", "ttft_ms", "decode_tps", "bytes_copied_restore", "bytes_copied_commit", "restored_kv_bytes", "bytes_copied_batch", "drafted", "accepted", "draft_steps")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    PLAN_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TPS_FIELD_NUMBER: _ClassVar[int]
    BYTES_COPIED_RESTORE_FIELD_NUMBER: _ClassVar[int]
    BYTES_COPIED_COMMIT_FIELD_NUMBER: _ClassVar[int]
    RESTORED_KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_COPIED_BATCH_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_STEPS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    plan_ms: float
    restore_ms: float
    prefill_ms: float
    commit_ms: float
    ttft_ms: float
    decode_tps: float
    bytes_copied_restore: int
    bytes_copied_commit: int
    restored_kv_bytes: int
    bytes_copied_batch: int
    drafted: int
    accepted: int
    draft_steps: int
    def __init__(self, queue_ms: _Optional[float] = ..., plan_ms: _Optional[float] = ..., restore_ms: _Optional[float] = ..., prefill_ms: _Optional[float] = ..., commit_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., decode_tps: _Optional[float] = ..., bytes_copied_restore: _Optional[int] = ..., bytes_copied_commit: _Optional[int] = ..., restored_kv_bytes: _Optional[int] = ..., bytes_copied_batch: _Optional[int] = ..., drafted: _Optional[int] = ..., accepted: _Optional[int] = ..., draft_steps: _Optional[int] = ...) -> None: ...

class Final(_message.Message):
    __slots__ = ("finish_reason", "usage", "restore", "timing", "request_id", "replica", "incomplete", "index", "stop_sequence")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    INCOMPLETE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    usage: Usage
    restore: Restore
    timing: Timing
    request_id: str
    replica: str
    incomplete: bool
    index: int
    stop_sequence: str
    def __init__(self, finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., restore: _Optional[_Union[Restore, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., request_id: _Optional[str] = ..., replica: _Optional[str] = ..., incomplete: _Optional[bool] = ..., index: _Optional[int] = ..., stop_sequence: _Optional[str] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("progress", "chunk", "final")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    progress: PrefillProgress
    chunk: TokenChunk
    final: Final
    def __init__(self, progress: _Optional[_Union[PrefillProgress, _Mapping]] = ..., chunk: _Optional[_Union[TokenChunk, _Mapping]] = ..., final: _Optional[_Union[Final, _Mapping]] = ...) -> None: ...

class CacheStatsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class CacheStatsReply(_message.Message):
    __slots__ = ("mode", "entries", "anchors", "checkpoints", "ram_bytes", "anchor_bytes", "disk_bytes", "disk_entries", "hits", "evictions", "disk_evictions", "damaged_files", "cached_tokens", "prompt_tokens", "replicas", "restores_lost", "disk_writes_lost", "misses", "disk_file_bytes", "disk_free_bytes", "flight_waits")
    class CheckpointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class HitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class MissesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MODE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ANCHORS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    ANCHOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    DISK_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_FILES_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RESTORES_LOST_FIELD_NUMBER: _ClassVar[int]
    DISK_WRITES_LOST_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    DISK_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FLIGHT_WAITS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    entries: int
    anchors: int
    checkpoints: _containers.ScalarMap[str, int]
    ram_bytes: int
    anchor_bytes: int
    disk_bytes: int
    disk_entries: int
    hits: _containers.ScalarMap[str, int]
    evictions: int
    disk_evictions: int
    damaged_files: int
    cached_tokens: int
    prompt_tokens: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStats]
    restores_lost: int
    disk_writes_lost: int
    misses: _containers.ScalarMap[str, int]
    disk_file_bytes: int
    disk_free_bytes: int
    flight_waits: int
    def __init__(self, mode: _Optional[str] = ..., entries: _Optional[int] = ..., anchors: _Optional[int] = ..., checkpoints: _Optional[_Mapping[str, int]] = ..., ram_bytes: _Optional[int] = ..., anchor_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., disk_entries: _Optional[int] = ..., hits: _Optional[_Mapping[str, int]] = ..., evictions: _Optional[int] = ..., disk_evictions: _Optional[int] = ..., damaged_files: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStats, _Mapping]]] = ..., restores_lost: _Optional[int] = ..., disk_writes_lost: _Optional[int] = ..., misses: _Optional[_Mapping[str, int]] = ..., disk_file_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., flight_waits: _Optional[int] = ...) -> None: ...

class ReplicaStats(_message.Message):
    __slots__ = ("replica", "alive", "entries", "ram_bytes", "queued_prefill_tokens", "in_flight", "requests", "restores", "handovers", "handover_bytes", "sessions", "session_moves")
    class RestoresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    HANDOVERS_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_MOVES_FIELD_NUMBER: _ClassVar[int]
    replica: int
    alive: bool
    entries: int
    ram_bytes: int
    queued_prefill_tokens: int
    in_flight: int
    requests: int
    restores: _containers.ScalarMap[str, int]
    handovers: int
    handover_bytes: int
    sessions: int
    session_moves: int
    def __init__(self, replica: _Optional[int] = ..., alive: _Optional[bool] = ..., entries: _Optional[int] = ..., ram_bytes: _Optional[int] = ..., queued_prefill_tokens: _Optional[int] = ..., in_flight: _Optional[int] = ..., requests: _Optional[int] = ..., restores: _Optional[_Mapping[str, int]] = ..., handovers: _Optional[int] = ..., handover_bytes: _Optional[int] = ..., sessions: _Optional[int] = ..., session_moves: _Optional[int] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("recent", "model")
    RECENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    recent: int
    model: str
    def __init__(self, recent: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class ReplicaFigures(_message.Message):
    __slots__ = ("name", "queue_requests", "queue_prefill_tokens", "running", "tokens_per_s", "ttft_p50_ms", "ram_bytes", "mlx_active_bytes", "mlx_peak_bytes", "disk_written_bytes", "disk_read_bytes", "grammars_compiled", "grammar_hits", "grammars_held", "disk_writes_lost", "disk_state", "disk_paused_s", "disk_files_written")
    class DiskWritesLostEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_P50_MS_FIELD_NUMBER: _ClassVar[int]
    RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    MLX_ACTIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MLX_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_WRITTEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRAMMARS_COMPILED_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_HITS_FIELD_NUMBER: _ClassVar[int]
    GRAMMARS_HELD_FIELD_NUMBER: _ClassVar[int]
    DISK_WRITES_LOST_FIELD_NUMBER: _ClassVar[int]
    DISK_STATE_FIELD_NUMBER: _ClassVar[int]
    DISK_PAUSED_S_FIELD_NUMBER: _ClassVar[int]
    DISK_FILES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    queue_requests: int
    queue_prefill_tokens: int
    running: int
    tokens_per_s: float
    ttft_p50_ms: float
    ram_bytes: int
    mlx_active_bytes: int
    mlx_peak_bytes: int
    disk_written_bytes: int
    disk_read_bytes: int
    grammars_compiled: int
    grammar_hits: int
    grammars_held: int
    disk_writes_lost: _containers.ScalarMap[str, int]
    disk_state: str
    disk_paused_s: float
    disk_files_written: int
    def __init__(self, name: _Optional[str] = ..., queue_requests: _Optional[int] = ..., queue_prefill_tokens: _Optional[int] = ..., running: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., ttft_p50_ms: _Optional[float] = ..., ram_bytes: _Optional[int] = ..., mlx_active_bytes: _Optional[int] = ..., mlx_peak_bytes: _Optional[int] = ..., disk_written_bytes: _Optional[int] = ..., disk_read_bytes: _Optional[int] = ..., grammars_compiled: _Optional[int] = ..., grammar_hits: _Optional[int] = ..., grammars_held: _Optional[int] = ..., disk_writes_lost: _Optional[_Mapping[str, int]] = ..., disk_state: _Optional[str] = ..., disk_paused_s: _Optional[float] = ..., disk_files_written: _Optional[int] = ...) -> None: ...

class TierFigures(_message.Message):
    __slots__ = ("tier", "nbytes", "budget")
    TIER_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    tier: str
    nbytes: int
    budget: int
    def __init__(self, tier: _Optional[str] = ..., nbytes: _Optional[int] = ..., budget: _Optional[int] = ...) -> None: ...

class KindFigures(_message.Message):
    __slots__ = ("kind", "requests", "cached_tokens", "prompt_tokens")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    requests: int
    cached_tokens: int
    prompt_tokens: int
    def __init__(self, kind: _Optional[str] = ..., requests: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class AnchorFigures(_message.Message):
    __slots__ = ("entry_id", "namespace", "length", "nbytes", "sessions")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    namespace: str
    length: int
    nbytes: int
    sessions: int
    def __init__(self, entry_id: _Optional[int] = ..., namespace: _Optional[str] = ..., length: _Optional[int] = ..., nbytes: _Optional[int] = ..., sessions: _Optional[int] = ...) -> None: ...

class RequestRecord(_message.Message):
    __slots__ = ("request_id", "replica", "namespace", "finish_reason", "restore_kind", "prompt_tokens", "cached_tokens", "completion_tokens", "timing", "finished_at", "miss_kind", "miss_token", "miss_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    RESTORE_KIND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    MISS_KIND_FIELD_NUMBER: _ClassVar[int]
    MISS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MISS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    replica: str
    namespace: str
    finish_reason: str
    restore_kind: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timing: Timing
    finished_at: float
    miss_kind: str
    miss_token: int
    miss_message: int
    def __init__(self, request_id: _Optional[str] = ..., replica: _Optional[str] = ..., namespace: _Optional[str] = ..., finish_reason: _Optional[str] = ..., restore_kind: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., finished_at: _Optional[float] = ..., miss_kind: _Optional[str] = ..., miss_token: _Optional[int] = ..., miss_message: _Optional[int] = ...) -> None: ...

class InspectReply(_message.Message):
    __slots__ = ("cache", "replicas", "tiers", "window_s", "window", "anchors", "recent")
    CACHE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    ANCHORS_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    cache: CacheStatsReply
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaFigures]
    tiers: _containers.RepeatedCompositeFieldContainer[TierFigures]
    window_s: float
    window: _containers.RepeatedCompositeFieldContainer[KindFigures]
    anchors: _containers.RepeatedCompositeFieldContainer[AnchorFigures]
    recent: _containers.RepeatedCompositeFieldContainer[RequestRecord]
    def __init__(self, cache: _Optional[_Union[CacheStatsReply, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaFigures, _Mapping]]] = ..., tiers: _Optional[_Iterable[_Union[TierFigures, _Mapping]]] = ..., window_s: _Optional[float] = ..., window: _Optional[_Iterable[_Union[KindFigures, _Mapping]]] = ..., anchors: _Optional[_Iterable[_Union[AnchorFigures, _Mapping]]] = ..., recent: _Optional[_Iterable[_Union[RequestRecord, _Mapping]]] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfoReply(_message.Message):
    __slots__ = ("model", "model_type", "vocab_size", "max_context", "fingerprint", "cache_mode", "has_state_layers", "kernels", "output_format", "models")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CACHE_MODE_FIELD_NUMBER: _ClassVar[int]
    HAS_STATE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    model: str
    model_type: str
    vocab_size: int
    max_context: int
    fingerprint: str
    cache_mode: str
    has_state_layers: bool
    kernels: _containers.RepeatedScalarFieldContainer[str]
    output_format: str
    models: _containers.RepeatedCompositeFieldContainer[ServedModel]
    def __init__(self, model: _Optional[str] = ..., model_type: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context: _Optional[int] = ..., fingerprint: _Optional[str] = ..., cache_mode: _Optional[str] = ..., has_state_layers: _Optional[bool] = ..., kernels: _Optional[_Iterable[str]] = ..., output_format: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ServedModel, _Mapping]]] = ...) -> None: ...

class ServedModel(_message.Message):
    __slots__ = ("name", "state", "aliases", "model", "output_format", "max_context")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    model: str
    output_format: str
    max_context: int
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., output_format: _Optional[str] = ..., max_context: _Optional[int] = ...) -> None: ...

class CacheTreeRequest(_message.Message):
    __slots__ = ("recent", "namespace")
    RECENT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    recent: int
    namespace: str
    def __init__(self, recent: _Optional[int] = ..., namespace: _Optional[str] = ...) -> None: ...

class TreeCheckpoint(_message.Message):
    __slots__ = ("length", "kind", "nbytes")
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    length: int
    kind: str
    nbytes: int
    def __init__(self, length: _Optional[int] = ..., kind: _Optional[str] = ..., nbytes: _Optional[int] = ...) -> None: ...

class TreeEntry(_message.Message):
    __slots__ = ("entry_id", "namespace", "role", "length", "prompt_len", "nbytes", "tier", "parent", "shared", "own_bytes", "checkpoints", "sessions", "last_used")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    OWN_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    namespace: str
    role: str
    length: int
    prompt_len: int
    nbytes: int
    tier: str
    parent: int
    shared: int
    own_bytes: int
    checkpoints: _containers.RepeatedCompositeFieldContainer[TreeCheckpoint]
    sessions: _containers.RepeatedScalarFieldContainer[str]
    last_used: int
    def __init__(self, entry_id: _Optional[int] = ..., namespace: _Optional[str] = ..., role: _Optional[str] = ..., length: _Optional[int] = ..., prompt_len: _Optional[int] = ..., nbytes: _Optional[int] = ..., tier: _Optional[str] = ..., parent: _Optional[int] = ..., shared: _Optional[int] = ..., own_bytes: _Optional[int] = ..., checkpoints: _Optional[_Iterable[_Union[TreeCheckpoint, _Mapping]]] = ..., sessions: _Optional[_Iterable[str]] = ..., last_used: _Optional[int] = ...) -> None: ...

class ViewRequest(_message.Message):
    __slots__ = ("request_id", "session", "namespace", "restore_kind", "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "finished_at", "miss")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RESTORE_KIND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    MISS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    session: str
    namespace: str
    restore_kind: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_ms: float
    finished_at: float
    miss: str
    def __init__(self, request_id: _Optional[str] = ..., session: _Optional[str] = ..., namespace: _Optional[str] = ..., restore_kind: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., finished_at: _Optional[float] = ..., miss: _Optional[str] = ...) -> None: ...

class MemoryPart(_message.Message):
    __slots__ = ("name", "nbytes", "used")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    name: str
    nbytes: int
    used: int
    def __init__(self, name: _Optional[str] = ..., nbytes: _Optional[int] = ..., used: _Optional[int] = ...) -> None: ...

class DiskWriterView(_message.Message):
    __slots__ = ("replica", "state", "paused_s", "files_written", "writes_lost")
    class WritesLostEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_S_FIELD_NUMBER: _ClassVar[int]
    FILES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    WRITES_LOST_FIELD_NUMBER: _ClassVar[int]
    replica: str
    state: str
    paused_s: float
    files_written: int
    writes_lost: _containers.ScalarMap[str, int]
    def __init__(self, replica: _Optional[str] = ..., state: _Optional[str] = ..., paused_s: _Optional[float] = ..., files_written: _Optional[int] = ..., writes_lost: _Optional[_Mapping[str, int]] = ...) -> None: ...

class DiskTierView(_message.Message):
    __slots__ = ("held_bytes", "file_bytes", "free_bytes", "budget", "writers")
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    WRITERS_FIELD_NUMBER: _ClassVar[int]
    held_bytes: int
    file_bytes: int
    free_bytes: int
    budget: int
    writers: _containers.RepeatedCompositeFieldContainer[DiskWriterView]
    def __init__(self, held_bytes: _Optional[int] = ..., file_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., budget: _Optional[int] = ..., writers: _Optional[_Iterable[_Union[DiskWriterView, _Mapping]]] = ...) -> None: ...

class CacheTreeReply(_message.Message):
    __slots__ = ("mode", "entries", "left_out", "ram_bytes", "disk_bytes", "recent", "memory_limit", "memory", "disk")
    MODE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    mode: str
    entries: _containers.RepeatedCompositeFieldContainer[TreeEntry]
    left_out: int
    ram_bytes: int
    disk_bytes: int
    recent: _containers.RepeatedCompositeFieldContainer[ViewRequest]
    memory_limit: int
    memory: _containers.RepeatedCompositeFieldContainer[MemoryPart]
    disk: DiskTierView
    def __init__(self, mode: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[TreeEntry, _Mapping]]] = ..., left_out: _Optional[int] = ..., ram_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., recent: _Optional[_Iterable[_Union[ViewRequest, _Mapping]]] = ..., memory_limit: _Optional[int] = ..., memory: _Optional[_Iterable[_Union[MemoryPart, _Mapping]]] = ..., disk: _Optional[_Union[DiskTierView, _Mapping]] = ...) -> None: ...
