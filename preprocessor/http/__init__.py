"""The OpenAI-compatible HTTP face of the preprocessor (vLLM's request format): a second front on the same
core as the gRPC servicer, served by uvicorn on the gRPC server's event loop.

  options.py    HttpOptions (port, API key and what it leaves open, remote media policy, connection guards)
  schemas.py    pydantic request bodies
  convert.py    bodies -> content.py dataclasses + SamplingParams (media.py then fetches allowed http(s) images)
  responses.py  GenerationChunks -> OpenAI JSON (whole responses and stream chunks)
  streaming.py  SSE, and cancellation when the client disconnects
  errors.py     SpliceError code -> HTTP status, OpenAI's error body
  auth.py       the bearer API key, in front of every route but the open ones
  admission.py  admission by Content-Length, body bytes counted as they arrive
  connections.py  header time limit and connection limit on uvicorn's h11 protocol
  app.py        the FastAPI routes; server.py runs them on the current loop
"""
