"""The FastAPI app of the OpenAI-compatible face: the routes of routes.py (and loras.py behind
--allow-runtime-lora-updating) on the engine link and options it holds for them (serving.py), behind the admission
and key middlewares. OpenAPI page at /docs. With a key, every route but /health needs it (auth.py), /metrics and the
docs unless opened.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from preprocessor.admission import Admission
from preprocessor.engine_link import EngineLink
from preprocessor.http.admission import AdmissionMiddleware
from preprocessor.http.auth import KeyMiddleware
from preprocessor.http.errors import install_error_handlers
from preprocessor.http.loras import lora_routes
from preprocessor.http.options import HttpOptions
from preprocessor.http.routes import api, open_routes
from preprocessor.http.serving import Serving
from preprocessor.http.streaming import ClientGone

# Not a real status: nginx's "client closed request", for the log line of an answer nobody reads.
CLIENT_CLOSED = 499


def _open_paths(app: FastAPI, options: HttpOptions) -> list[str]:
    """What stays open when a key is set, besides /health: metrics and the API docs, each when its flag says so."""
    paths = ["/metrics"] if options.open_metrics else []
    if options.open_docs:
        paths += [p for p in (app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url) if p]
    return paths


async def _gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=CLIENT_CLOSED)


def build_app(link: EngineLink, options: HttpOptions, admission: Admission | None = None) -> FastAPI:
    """`admission`: shared with the gRPC face, so one set of caps covers both."""
    app = FastAPI(title="Splice", summary="OpenAI-compatible API (vLLM's format) of the Splice preprocessor")
    app.state.serving = serving = Serving(link, options)
    app.state.body_caps = serving.body_caps
    install_error_handlers(app)
    app.add_exception_handler(ClientGone, _gone)
    if admission is not None:
        app.add_middleware(AdmissionMiddleware, admission=admission, idle=options.body_idle_timeout)
    if options.api_key:  # added last: outermost, so a request without the key is not even admitted
        app.add_middleware(KeyMiddleware, api_key=options.api_key, open_paths=_open_paths(app, options))
    app.include_router(open_routes)
    app.include_router(api)
    if options.allow_runtime_lora_updating:
        app.include_router(lora_routes)
    return app
