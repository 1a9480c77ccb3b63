"""The life of `lineage serve`: preflight, Ray and the engine started and stopped together.

`preflight` answers before Ray starts (ports, the model, a model fetched by name);
`serve` starts the actors and the gRPC server; `fleet` routes several served models
by name in one set of memory shares; `lifecycle` is the process (signals, sidecars, a stop
within a deadline, with `stopping`); `background` runs an engine on a thread of its
own for tests and benchmarks. Its way in: `lifecycle.run` (the CLI).

The top floor: it may import every other package of the server; none imports it.
"""
