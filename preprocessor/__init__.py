"""splice.v1.Preprocessor: conversations in, normalized engine requests out, streamed text back.

Request lifecycle (DESIGN.md steps 1-7), one file per step:
  convert.py     pb -> content.py dataclasses (Text / Image / Embeds / TokenIds, each with its location)
  embeds.py      prompt_embeds (raw tensor, vLLM base64 torch.save, safetensors) -> [n, hidden], capped;
                 torch_archive.py checks a torch.save zip before torch.load reads it
  images.py      bytes / data: URL / allowed path -> RGB PIL image, header checked against the caps first
                 (both charge what they decode to the request's admission, admission.py, before allocating)
  mm_embeds.py   image_embeds (--enable-mm-embeds): precomputed image features checked against the geometry
                 their family needs (embeds_geometry.py), the placeholder expanded by the processor from it
  template_args.py  vLLM's documents / reasoning_effort -> template arguments (for both faces)
  template.py    chat template -> prompt text; part k of the prompt_embeds parts as sentinel k, image
                 parts as the processor's placeholder
  normalize.py   tokenize through the processor (image expansion, pixel tensors), then the model files'
                 Sentinels (sentinel.py) splice: expand, locate all spans (by sentinel identity), consume;
                 then the rules shared with the engine (splice/request_rules.py) against its ModelInfo.
                 Complete builds its spans from part boundaries, without sentinels
  stream.py      engine tokens -> detokenizer.py (whole characters only) -> stop.py -> GenerationChunks
  core.py        PreprocessorCore: the RPCs on dataclasses, no grpc
  engine_link.py the engine connection: watches the engine, holds the current core, readiness;
                 engine_client.py its Generate / GetModelInfo calls; engine_replicas.py every replica
                 behind the target, each called on its own (ResetPrefixCache)
  servicer.py / server.py / cli.py   the grpc.aio shell (wiring only); metrics.py its Prometheus metrics
  http/          the OpenAI-compatible HTTP face (FastAPI + uvicorn on the same event loop and engine link):
                 schemas.py bodies -> convert.py content dataclasses -> the same core calls -> responses.py
                 JSON / streaming.py SSE; errors.py maps each SpliceError code to one HTTP status
"""
