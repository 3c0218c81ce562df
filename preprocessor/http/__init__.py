"""The OpenAI-compatible HTTP face of the preprocessor (vLLM's request format): a second front on the same
core as the gRPC servicer, served by uvicorn on the gRPC server's event loop.

  options.py    HttpOptions (port, API key, remote media policy)
  schemas.py    pydantic request bodies
  convert.py    bodies -> content.py dataclasses + SamplingParams (media.py fetches allowed http(s) images first)
  responses.py  GenerationChunks -> OpenAI JSON (whole responses and stream chunks)
  streaming.py  SSE, and cancellation when the client disconnects
  errors.py     SpliceError code -> HTTP status, OpenAI's error body
  auth.py       the bearer API key
  app.py        the FastAPI routes; server.py runs them on the current loop
"""
