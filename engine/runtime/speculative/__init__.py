"""Speculative decoding: drafts verified in one forward, and the caches rolled back.

What it knows: where drafts come from (`drafts`: prompt lookup; `draft_model`: a
smaller model of the same tokenizer; `mtp`, `mtp_drafts`: the model's own MTP head),
how many a row asks for (`draft_length`, `mtp_costs`), how a verify forward's tokens
are accepted (`verification`), how every layer cache goes back to the kept tokens
(`rollback`, `state_replay`), and a constrained row's drafts (`constrained_drafts`).
`speculative_batch` is the generation batch that runs all of it; `speculation`
reads `--speculative` and builds what a replica runs.

Its one way in from outside: `speculation.speculation_for(config, model)`, whose
`Speculation` the batch generator hands to `speculative_batch`
(the draft model's directory is loaded and checked by `engine.runtime.model.draft_files`).

It must not import `batching`, the `tier`, the generator or anything above the
runtime; it uses `structured` (a constrained row's mask) and `model` (the served
model's directory, the draft model's files); `model` never imports it back
(tests/test_layering.py).
"""
