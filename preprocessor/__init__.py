"""splice.v1.Preprocessor: conversations in, normalized engine requests out, streamed text back.

A request's life, step by step with the function of each: docs/architecture.md ("A request in the preprocessor").
One file per step:
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
  core.py        PreprocessorCore: a request prepared (normalized, every refusal made), its choices' streams from
                 the engine, Tokenize / Detokenize / GetModelInfo; no grpc, no JSON
  stream.py      engine tokens -> detokenizer.py (whole characters only) -> stop.py -> GenerationChunks
  answer.py      a request's answer, the one pipeline of both faces: echo, tool calls (tools/), usage, as the
                 typed events of outputs.py
  engine_link.py the engine connection: watches the engine, holds the current core, readiness;
                 engine_client.py its calls (the Multiplex stream by default: engine_multiplex.py; Generate /
                 GenerateWhole); engine_replicas.py every replica behind the target, each called on its own
                 (ResetPrefixCache)
  servicer.py / encode.py / server.py / cli.py   the grpc.aio shell: decode (convert.py), one core call,
                 encode (encode.py); metrics.py its Prometheus metrics
  http/          the OpenAI-compatible HTTP face (FastAPI + uvicorn on the same event loop and engine link):
                 schemas.py bodies -> convert.py / decode.py content dataclasses -> the same pipeline (answer.py)
                 -> responses.py JSON / streaming.py SSE; routes.py the routes; errors.py maps each SpliceError
                 code to one HTTP status
"""
