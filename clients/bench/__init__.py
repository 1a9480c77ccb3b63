"""`lineage bench <name>`: benchmarks, commands that print figures measured in one run.

Each benchmark is a module of this package, `clients.bench.<name>`, with
`HELP` (one line), `add_arguments(parser)` and `run(args) -> int`; importing
it is cheap (MLX, Ray and matplotlib load inside `run`). The command
(clients.cli.bench) lists them and imports only the one that runs. What they
share lives in `figures` (percentiles, tables, JSON, plots) and `harness`
(their own Ray, the serve flags' EngineConfig, the model directory). Speed is
shown here, in figures and ratios measured in one run, never by timed tests.
"""
