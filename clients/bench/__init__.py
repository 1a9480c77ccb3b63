"""`lineage bench <name>`: benchmarks, commands that print figures measured in one run.

Each benchmark is a package of its own, `clients.bench.<name>`, its entry in
its `__init__` with `HELP` (one line), `add_arguments(parser)` and
`run(args) -> int`, and its helpers beside it (agents' traffic and report,
decode's run and layers, faults' checks and injection, ...); importing it is
cheap (MLX, Ray and matplotlib load inside `run`). The command (clients.cli.bench)
lists them and imports only the one that runs. What several share sits here:
`figures` (percentiles, tables, JSON, plots), `harness` (their own Ray, the serve
flags' EngineConfig, the model directory) and `peer` (a real `mlx_lm.server`). Speed is
shown here, in figures and ratios measured in one run, never by timed tests.
"""
