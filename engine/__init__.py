"""splice.v1.Engine: serves one HF model for the preprocessor (DESIGN.md, engine steps 1-6).

A request's life, file by file:
1. servicer.py   reassembles the Generate client stream (splice.engine_wire.RequestAssembler).
2. llm_engine.py `generate()` re-validates it (splice.request_rules, the same rules the preprocessor
   applied, + validate.py: image rows vs the vision family) and queues a Sequence (sequence.py).
3. scheduler.py  admits it at the next step boundary, within the running / token / queue limits.
4. embedder.py   looks up its IDs, runs the vision tower (vision.py) and merges images and supplied rows.
5. model_runner.py prefills it and concatenates its KV cache into the running batch; every later step
   decodes all running rows in one forward.
6. sampler.py    picks each row's token; sequence.py decides STOP / LENGTH; the output is streamed.
7. Finished or aborted rows are filtered out of the batch at once; an abort lands before the next step.
server.py wires health (NOT_SERVING until loaded and warm), reflection and the error interceptor; cli.py
is `splice engine`.
"""
