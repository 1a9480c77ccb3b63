"""The front end: a request's road from prompt to plan, run and stream. No gRPC types.

- `frontend.Frontend`: the way in (`generate`): admission, the prompt (through
  `prompts`), the restore plan, the retries when a replica fails;
- `in_flight.InFlight`: the requests in flight: their ids inside the engine,
  the session key each named, their prompts and cancels (a retry waits for them);
- `run.Runs`: one run streamed: the request on its replica, its events with
  their text, its end;
- `inspection.Inspector`: what is shown: the request log line, each request's
  record, the metrics, the live figures and the cache page's;
- `reply`, `text`: the client's reply (text, stop strings) from the token ids
  the model sends, once per step for the whole batch.

It imports `prompts`, `observe` and `supervision`; not `rpc` or `running`.
"""
