"""Supervision: the actors' restarts, the epoch handshake, health that follows them.

`supervisor` restarts a crashed model actor or cache manager and resynchronises;
`replica_events` is the front end's end of the replicas' event streams.

It imports nothing of the server but `errors`.
"""
