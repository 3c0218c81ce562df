"""splice.v1.Engine: serves one HF model for the preprocessor (DESIGN.md, engine steps 1-6).

A request's life, file by file:
1. servicer.py   reassembles the Generate client stream (splice.engine_wire.RequestAssembler), or the same parts
   whole in one GenerateWhole message, and goes on as soon as the declared bytes are in.
2. llm_engine.py `generate()` re-validates it (splice.request_rules, the same rules the preprocessor
   applied, + validate.py: image rows vs the vision family) and queues a Sequence (sequence.py).
3. scheduler.py  admits it at the next step boundary, within the running / token / queue limits (while
   others decode, at most --mixed-prefill-tokens prompt positions per step).
4. models/<family>.py `prompt()` looks up its IDs, runs the vision tower and merges images and supplied rows.
5. model_runner.py prefills it into a free slot of the KV cache (models/slot_cache.py); every step decodes all
   running rows in one forward, which also carries the prompt positions admitted that step where the family
   allows it (`mixed`: one packed row of tokens, attention split per sequence).
6. sampler.py    picks each row's token; sequence.py decides STOP / LENGTH; outbox.py hands the step's outputs
   to the event loop at once (and to each stream every --stream-interval tokens).
7. Finished or aborted rows leave the batch at once; an abort lands before the next step.
server.py wires health (NOT_SERVING until loaded and warm), reflection and the call guard (errors, metrics, key,
drain: splice/call_guard.py); cli.py
is `splice engine`; tensor_parallel.py + tp_worker.py run the model calls on every rank.
"""
