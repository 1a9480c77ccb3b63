"""The batch generator: mlx-lm's batches with the warm path's copies out, and chunked prefill.

What it knows: the batch of sequences and how a step runs it. `batch` is mlx-lm's
BatchGenerator with the restore merge as the warm turn's only KV copy (the
`--schedule batched` baseline); `chunked` runs the prefill policy's chunks beside
decode (`--schedule srpt|fifo`), a chunk's forward on `prefill_worker`'s thread;
`prefill_policy` picks which chunk runs next and how long it is (plain Python), from
the costs `chunk_costs` fits to the chunks run (a fixed cost and a cost per token);
`prefill_log` keeps each prefill's chunks and each request's time split (in `ring`s, fixed-size
records allocated up front, as `step_profile` keeps its steps); `for_schedule` builds
the generator a configuration asks for; `copies` charges mlx-lm's cache copies to
sequences; `step_profile` and `layer_timer` record where a step's time goes.

Its one way in from outside: `for_schedule.new_batch_generator(config, model, ...)`
(the Generator calls it; benchmarks also call `batch.merge_with_room`).

It must not import the tier, the model loader, the generator or anything above the
runtime; it uses `speculative` (the speculative generation batch), `structured`
(the masked batch) and `layer_caches`. `prefill_policy`, `chunk_costs` and `prefill_log`
import nothing but the standard library (`prefill_log`: and numpy through the plain `ring`;
tests/test_layering.py).
"""
