"""What the HTTP routes serve from: the engine link (whose current core answers) and the face's options, held on
app.state by build_app and handed to each route as a dependency (app_serving); and the names a request's `model`
may be, as vLLM's: one of the base model's served names (--served-model-name), a LoRA adapter's (vLLM's 404 for any
other name), or none."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from preprocessor.core import MAX_DETOKENIZE_IDS, PreprocessorCore
from preprocessor.engine_link import EngineLink
from preprocessor.http.body import Caps
from preprocessor.http.options import HttpOptions
from preprocessor.request_bounds import max_chars
from preprocessor.token_strings import TokenStrings
from preprocessor.tools.request import MAX_TOOLS
from splice.errors import NotFound, SpliceError
from splice.request_rules import VOCABULARY_BOUNDED


@dataclass(frozen=True)
class Served:
    """A generating request's model: the core that answers it and the names its answer carries."""

    core: PreprocessorCore
    lora: str  # the LoRA adapter's name, "" for the base model
    model: str  # the answer's `model`: the adapter's name, or the first served name
    options: HttpOptions

    def strings(self, as_ids: bool | None) -> TokenStrings:
        """How the request's logprobs spell tokens; `as_ids`: its return_tokens_as_token_ids (None: the server's)."""
        return self.core.token_strings(self.options.return_tokens_as_token_ids if as_ids is None else as_ids)


@dataclass(frozen=True)
class Serving:
    link: EngineLink
    options: HttpOptions

    def names(self, core: PreprocessorCore) -> tuple[str, ...]:
        """The base model's served names (vLLM's --served-model-name; by default the model's own name)."""
        return self.options.served_model_names or (core.info.model,)

    def core(self, model: str | None) -> PreprocessorCore:
        """The core, for a request naming `model`: one of the served names, or none. (Generating requests, which may
        name an adapter, ask `served`.)"""
        core = self.link.core()
        names = self.names(core)
        if model is not None and model not in names:
            raise NotFound(f"model {model!r} is not served here; this server serves {', '.join(map(repr, names))}",
                           param="model")
        return core

    async def served(self, model: str | None) -> Served:
        """A generating request's `model`: a served name, a LoRA adapter's, or none (the base)."""
        core = self.link.core()
        names = self.names(core)
        lora = "" if model is None or model in names else await self._adapter(model, names)
        return Served(core, lora, lora or names[0], self.options)

    async def _adapter(self, model: str, names: tuple[str, ...]) -> str:
        loras = self.link.loras
        try:
            return await loras.check(model)
        except NotFound:
            adapters = f" and its LoRA adapters {sorted(loras.adapters)}" if loras.adapters else ""
            raise NotFound(f"The model `{model}` does not exist: it is not served here; this server serves "
                           f"{', '.join(map(repr, names))}{adapters}", param="model") from None
        except SpliceError as exc:  # (the engine cannot be asked now)
            raise NotFound(f"The model `{model}` does not exist: {exc.message}", param="model") from None

    def body_caps(self) -> Caps:
        """What a large body's fields may hold, for the model served now (body.py counts them as it parses)."""
        core = self.link.core()
        info = core.info
        vocab = (info.vocab_rows, f"each names a token of the engine's vocabulary of {info.vocab_rows} (vLLM's rule)")
        positions = (info.max_model_len, f"each takes a position of the engine's max_model_len {info.max_model_len}")
        chars = max_chars(info, core.files)
        prompts = max(info.max_model_len, core.limits.max_prompts)
        return Caps({**dict.fromkeys(VOCABULARY_BOUNDED, vocab), "messages": positions,
                     "prompt": (prompts, f"a prompt's token IDs take positions of the engine's max_model_len "
                                         f"{info.max_model_len}; a request has at most {core.limits.max_prompts} "
                                         f"prompts"),
                     "tools": (MAX_TOOLS, "the tools a request may carry"),
                     "tokens": (MAX_DETOKENIZE_IDS, "the token IDs one /detokenize takes")},
                    default=(max(chars, info.vocab_rows), f"no field of a request to this model holds more (the "
                                                           f"prompt's {chars} characters, the vocabulary's tokens)"))


async def app_serving(request: Request) -> Serving:
    """A route's dependency: `serving: Annotated[Serving, Depends(app_serving)]`. A coroutine, so FastAPI runs it on
    the loop: it would run a plain function in a worker thread, a hand-off to and from it for every request."""
    return request.app.state.serving
