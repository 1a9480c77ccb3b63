"""The OpenAI-compatible HTTP bridge (FastAPI on uvicorn), a client of the gRPC API.

It knows the OpenAI wire format and the model's `<tool_call>` text; it knows
nothing of models, caches or Ray, and never loads MLX. Its modules:

- `app`: the FastAPI app (`create_app`): the gate, the error handlers, the
  routes of each wire format, `/v1/models` and `/health`;
- `chat_completions`: `/v1/chat/completions` and `/v1/completions`, OpenAI's
  shapes to the engine's Generate call and back (other wire formats go beside it);
- `tool_calls`: the model's `<tool_call>` text as OpenAI tool calls;
- `backend`: the engine side (an AsyncClient, health, the served model);
- `errors`: failures as OpenAI error bodies and HTTP statuses;
- `guard`: the body cap and the bearer-token check, as ASGI middleware;
- `server`: the app served by uvicorn (`start_bridge`, `run_bridge`).

`lineage bridge` (clients.cli.bridge) and `lineage serve --http-port` start it.
FastAPI, uvicorn and pydantic load only when a bridge is built.
"""
