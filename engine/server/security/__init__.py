"""Who may call, and what they may send.

`auth`: bearer tokens, the gRPC interceptor that checks them, TLS credentials;
`limits`: the limits on every field a client sends, checked before any work.

It imports nothing of the server but `errors`.
"""
