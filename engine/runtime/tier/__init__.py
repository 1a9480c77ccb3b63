"""The RAM tier in the model replica: stored entries' tensors, restores, what a request leaves.

What it knows: `ram` holds the entries' tensors keyed by entry id, and obeys the cache
manager's Orders (it never decides what to keep: engine.cache does); `restore` reads a
plan's restore point into fresh layer caches at admission, or sends it back as lost;
`finished_entries` builds what a finished request stores and the Commit describing
it; `commits` stages what a request leaves (an anchor mid-prefill too) until the
Orders answering its commit bring it in, or releases its plan; `stats` is what a
replica holds right now, as one value.

Its one way in from outside: `ram.RamTier` (the model actor and the Generator make
one), `restore.Restorer` and `commits.Commits` (the Generator's); the storage layer
reads `ram.StoredEntry`.

It must not import `batching`, `speculative`, `structured`, `model`, the generator
or anything above the runtime, nor `admission` (which sees the tier through its own
`TierView`); it uses the top's requests, events and order ledger, and `layer_caches`
(tests/test_layering.py).
"""
