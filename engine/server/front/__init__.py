"""The front end: a request's road from prompt to plan, run and stream. No gRPC types.

`frontend.Frontend` tokenizes (through `prompts`), asks the cache manager for a
restore plan, runs the request on a replica and streams its events; `reply` and
`text` make the client's reply (text, stop strings) from the token ids the model
sends, once per step for the whole batch. Its way in: `frontend.Frontend`.

It imports `prompts`, `observe` and `supervision`; not `rpc` or `running`.
"""
