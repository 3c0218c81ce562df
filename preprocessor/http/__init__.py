"""The OpenAI-compatible HTTP face of the preprocessor (vLLM's request format): a second front on the same
core as the gRPC servicer, served by uvicorn on the gRPC server's event loop.

  options.py    HttpOptions (port, API key and what it leaves open, remote media policy, connection guards)
  schemas.py    pydantic request bodies
  convert.py    bodies -> content.py dataclasses + SamplingParams + what they ask of the answer (answer.Asked);
                decode.py runs its checks (off the loop when costly); media.py then fetches allowed http(s) images
  routes.py     the routes (module-level, on an APIRouter): decode -> the core's pipeline (answer.py) -> encode;
                serving.py what they serve from (engine link, options, served names), a dependency on app.state
  responses.py  an answer's events -> OpenAI JSON (whole responses and stream chunks)
  streaming.py  SSE, and cancellation when the client disconnects
  errors.py     SpliceError code -> HTTP status, OpenAI's error body
  auth.py       the bearer API key, in front of every route but the open ones
  admission.py  admission by Content-Length, body bytes counted as they arrive
  connections.py  header time limit and connection limit on uvicorn's h11 protocol
  loras.py      the LoRA adapters' routes (behind --allow-runtime-lora-updating) and /v1/models entries
  app.py        the FastAPI app: the routes behind the middlewares; server.py runs it on the current loop
"""
