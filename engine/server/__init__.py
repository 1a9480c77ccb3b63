"""The server: what turns a client's call into the engine's work and back.

Its packages, top floor first (an arrow only points down this list):

- `running`: the life of `lineage serve` (preflight before Ray, Ray's actors and the
  gRPC server started and stopped together, the fleet of served models, stopping within
  a deadline). Its way in: `running.lifecycle.run` (the CLI), `running.background`
  (tests and benchmarks).
- `rpc`: the gRPC servicer and health checks: proto in, dataclasses to the front end,
  proto out; every domain error mapped to a status in one place. Way in:
  `rpc.service.create_server`.
- `front`: the front end's domain side: a request's road from prompt to plan, run and
  stream, and its reply text. Way in: `front.frontend.Frontend`.
- `prompts`: prompts from requests: validation, volatile lines, the chat template's
  renders, the layout and anchor boundary, the model's output format, the grammar a
  request's constraint asks for. Way in: `prompts.prompt.PromptBuilder`.
- `observe`: what is shown of the engine: recent requests, the cache page's view,
  Prometheus metrics, the cache figures clients are told.
- `supervision`: the actors' restarts, epochs and health; the replicas' event streams.
- `security`: who is calling (tokens, TLS) and the limits on every field a client sends.
- `errors`: the server's domain errors, which `rpc` maps to status codes.

It must not import `clients` (tests/test_layering.py, which also holds the floor order).
"""
