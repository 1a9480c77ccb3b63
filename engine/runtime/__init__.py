"""The model replica's runtime: requests in, a batch of sequences stepped on MLX, events out.

At the top, what a request goes through: `requests` (what is asked), `admission` (what
waits and what fits), `generator` (the step loop over the batch), `loop` (the thread
that drives it), `active` (one request in the batch), `branches` (`n` from one prefill),
`sampling`, `logprobs`, `events` and `output` (what goes back), `ordering` (the order
protocol with the cache manager) and `local` (the same classes on the calling thread,
no Ray). Below them, one package per concern, each with its index in its `__init__`:

- `batching`: mlx-lm's batch generator with the warm path's copies out, chunked
  prefill, the prefill policy, and what a step costs;
- `speculative`: drafts (prompt lookup, a draft model, the MTP head) verified in
  one forward, and the rollback of the layer caches;
- `structured`: grammars and per-sequence matchers that mask a row's logits;
- `tier`: the RAM tier's tensors, restores at admission, what a finished request
  stores;
- `model`: resolving, loading and fingerprinting the served model, and the tiny
  models the tests and the embedded default run;
- `layer_caches`: the cache contract every package uses: state snapshots, stored
  entries and zero-copy restores of mlx-lm's layer caches (it imports nothing of the
  engine).

Arrows point one way: the top composes the packages; `batching` uses
`speculative` and `structured`; `speculative` uses `structured`; `tier` uses the
top's requests and ledger only. Nothing here imports Ray, gRPC, the server, the
actors or the storage layer (tests/test_layering.py).
"""
