"""splice.v1.Engine: serves one HF model for the preprocessor (docs/architecture.md, engine steps 1-6; a request's
life in the engine, step by step with the function of each: docs/engine.md).

A request's life, file by file:
1. servicer.py + multiplex.py  take it as a call on the preprocessor's Multiplex stream (one message per step back
   for every call on the stream), or whole in one GenerateWhole message, or as the Generate client stream
   reassembled (splice.engine_wire.RequestAssembler) as soon as the declared bytes are in.
2. llm_engine.py `generate()` re-validates it (splice.request_rules, the same rules the preprocessor applied,
   + validate.py: image rows vs the vision family) and queues its record, a Sequence (sequence.py).
3. scheduler.py  admits it at the next step boundary, within the running / token / queue limits (while others
   decode, at most --mixed-prefill-tokens prompt positions per step): a Span of the step's plan.
4. models/<family>.py `prompt()` looks up its IDs, runs the vision tower and merges images and supplied rows.
5. model_runner.py `execute()` runs the plan: its prompt into a free slot of the KV cache (models/slot_cache.py),
   every running row decoded, in one packed forward where the family allows it (forwards.py).
6. sampler.py    picks each row's token; scheduler.py `update()` appends it and decides STOP / LENGTH; outbox.py
   hands the step's outputs to the event loop at once (and to each stream every --stream-interval tokens).
7. llm_engine.py `_release()`: finished or aborted sequences leave at once; an abort lands before the next step.
server.py wires health (NOT_SERVING until loaded and warm), reflection and the call guard (errors, metrics, key,
drain: splice/call_guard.py); cli.py is `splice engine`; tensor_parallel.py + tp_worker.py run the model calls on
every rank.
"""
