"""The gRPC edge: proto in, dataclasses to the front end, proto out.

`service` is the Engine servicer and `create_server(config, ...) -> (server, port)`;
every domain error becomes a status code there, in one place. `requests` reads a
Generate request's proto into the domain (its checks, prompt and sampling) and
`replies` writes the domain's events and views as proto. `health` holds the
standard health checks and the slots of the Engine calls.

It imports `front`, `prompts`, `observe` and `security`; nothing below imports it.
"""
