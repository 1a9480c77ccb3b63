"""The `lineage` command: one module per subcommand, and what they share.

`main` (clients.cli.main) builds the parser from the command modules (serve,
generate, chat, fanout, stats, top, cache, bridge, bench), each with `HELP`,
`add_arguments(parser)` and `run(args) -> int`; `args` holds what they share.
Only `lineage serve` and the benchmarks load MLX or Ray, when they run.
"""
