"""Short text-only requests are normalized on the event loop (a thread's hand-off costs more than their work);
anything with an image, embeddings or long text still goes to a thread, so it never stalls other streams. Both
ways give the engine the same request."""

from __future__ import annotations

import threading

import pytest

from preprocessor.answer import Asked, chat, complete
from preprocessor.content import TokenIds, Where
from preprocessor.core import INLINE_NORMALIZE_CHARS, PreprocessorCore
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.sampling import SamplingParams
from tests.preprocessor.pp_factories import conversation, png_bytes, rows


class _Recorder:
    """An engine backend that keeps what it was sent and answers one token."""

    def __init__(self) -> None:
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        yield EngineOutput((5,), (), FinishReason.LENGTH, Usage(request.prompt_len, 1))


class _Watched(PreprocessorCore):
    """The real core, noting which thread normalized each request."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[bool] = []  # True: on the event loop's thread

    def normalize_chat(self, *args, **kwargs):
        self.threads.append(threading.current_thread() is threading.main_thread())
        return super().normalize_chat(*args, **kwargs)

    def normalize_complete(self, *args, **kwargs):
        self.threads.append(threading.current_thread() is threading.main_thread())
        return super().normalize_complete(*args, **kwargs)


SAMPLING = SamplingParams(temperature=0.0, max_tokens=1)


async def _chat(core: _Watched, conv) -> None:
    async for _ in chat(core, conv, SAMPLING, Asked("r")):
        pass


@pytest.mark.parametrize(("name", "parts", "on_loop"), [
    ("tiny-text", ["Say one word about the sea."], True),
    ("tiny-text", ["x" * INLINE_NORMALIZE_CHARS], True),
    ("tiny-text", ["x" * (INLINE_NORMALIZE_CHARS + 1)], False),
    ("tiny-text", ["a" * (INLINE_NORMALIZE_CHARS // 2), "b" * (INLINE_NORMALIZE_CHARS // 2 + 1)], False),
    ("tiny-llava", [png_bytes(), "What is this?"], False),
    ("tiny-text", ["before", "rows"], False),  # "rows": a prompt_embeds part, filled in below
])
async def test_where_a_chat_request_is_normalized(tiny, name, parts, on_loop):
    files, info = tiny[name]
    parts = [rows(3, info.hidden_size) if p == "rows" else p for p in parts]
    core = _Watched(files, info, _Recorder())
    conv = conversation(("user", parts))
    await _chat(core, conv)
    assert core.threads == [on_loop]


async def test_complete_counts_token_ids_toward_the_bound(tiny):
    files, info = tiny["tiny-text"]
    core = _Watched(files, info, _Recorder())
    for n, on_loop in ((16, True), (INLINE_NORMALIZE_CHARS + 1, False)):
        async for _ in complete(core, [TokenIds(tuple([40] * n), Where(None, 0))], SAMPLING, Asked("r")):
            pass
        assert core.threads[-1] is on_loop


async def test_the_loop_and_a_thread_give_the_engine_the_same_request(tiny, monkeypatch):
    files, info = tiny["tiny-text"]
    conv = conversation(("system", "Be brief."), ("user", "Say one word about the sea."))
    inline, threaded = _Recorder(), _Recorder()
    await _chat(_Watched(files, info, inline), conv)
    monkeypatch.setattr("preprocessor.core.INLINE_NORMALIZE_CHARS", 0)
    core = _Watched(files, info, threaded)
    await _chat(core, conv)
    assert core.threads == [False]
    assert inline.requests == threaded.requests
