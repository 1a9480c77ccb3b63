"""The HTTP bridge (FastAPI on uvicorn): three wire formats over one engine call.

It knows OpenAI chat completions, Anthropic Messages and OpenAI Responses, and
the model's own reasoning and tool-call markup; it knows nothing of models,
caches or Ray, and never loads MLX. Its modules:

- `app`: the FastAPI app (`create_app`, `BridgeOptions`): the gate, the error
  handlers, the routes of each wire format, `/v1/models` and `/health`;
- `chat_completions`: `/v1/chat/completions` and `/v1/completions`;
- `anthropic_messages`, `anthropic_request`: `/v1/messages` and its
  `count_tokens`, Anthropic's shapes to the engine's Generate call and back;
- `responses`, `responses_input`, `response_store`: `/v1/responses` and the
  stored responses a follow-up continues from (`previous_response_id`);
- `parsers`, `blocks`: the completion's text as text, reasoning and tool calls
  (per model family, streamed), and as the newer wires' content blocks; `markups`
  each family's markers and call readers, `output_parser` the state machine that
  feeds text through them, `parts` the parts a parser answers; `calls`,
  `call_bodies`, `call_bodies_tagged`, `tag_calls` read a whole call's body per
  family, `call_streams`, `body_streams` what of an open call is settled while it
  streams; `literals` every JSON or Python value read out of model text, never
  raising (depth refused before a parser recurses);
- `models`: the served model names and alias patterns;
- `engine_call`: the one road into the engine: a parsed request of any wire
  (`Asked`) -> the backend call, with its session key and cache namespace
  read the same on every wire;
- `backend`: the engine side (an AsyncClient, health, the served model);
  `in_process`: the same in the engine's own process (`lineage serve
  --http-port`), calling its front end with no gRPC hop;
- `errors`: failures as each wire's error bodies and HTTP statuses;
- `guard`: who calls (`Caller`: token, identity, tenant), the body cap and the
  token check, as ASGI middleware;
- `server`: the app served by uvicorn (`start_bridge`, `run_bridge`).

`lineage bridge` (clients.cli.bridge) and `lineage serve --http-port` start it.
FastAPI, uvicorn and pydantic load only when a bridge is built.
"""
