"""n > 1 choices in the core's streams: the engine's outputs of each choice (by index, interleaved) are detokenized
and stopped on their own; the request ends once every choice has; a completions batch numbers prompt p's choice j
as p x n + j (vLLM's order). The engine is a scripted backend (the engine's side: tests/engine/test_fork.py)."""

from __future__ import annotations

import asyncio

from preprocessor.admission import Admission
from preprocessor.content import Text, Where
from preprocessor.core import PreprocessorCore
from preprocessor.http.responses import ChatShape, Shape
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.sampling import SamplingParams
from tests.preprocessor.http_face import http_face
from tests.preprocessor.pp_factories import chat_chunks, conversation

ANSWERS = ("Red apples stop here and more.", "Green pears grow slowly in the orchard all summer, then fall.",
           "Blue plums stop early.")


class ChoicesEngine:
    """Replays one token list per choice, round robin, one token per output; the last output of each is final."""

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = answers
        self.requests = []
        self.sent = [0] * len(answers)
        self.closed = asyncio.Event()

    async def generate(self, request):
        self.requests.append(request)
        assert request.sampling.n == len(self.answers)
        try:
            for step in range(max(map(len, self.answers))):
                for i, ids in enumerate(self.answers):
                    if step < len(ids):
                        self.sent[i] += 1
                        last = step == len(ids) - 1
                        yield EngineOutput((ids[step],), finish_reason=FinishReason.LENGTH if last else None,
                                           usage=Usage(request.prompt_len, len(ids)) if last else None, index=i)
                        await asyncio.sleep(0)
        finally:
            self.closed.set()


def _by_choice(chunks) -> dict[int, list]:
    out: dict[int, list] = {}
    for index, chunk in chunks:
        assert index == chunk.index
        out.setdefault(index, []).append(chunk)
    return out


async def test_each_choice_is_detokenized_and_stopped_on_its_own(tiny):
    files, info = tiny["tiny-text"]
    answers = [files.tokenizer(a, add_special_tokens=False)["input_ids"] for a in ANSWERS]
    engine = ChoicesEngine(answers)
    core = PreprocessorCore(files, info, engine)
    prepared = await core.prepare_chat(conversation(("user", "Hi")), SamplingParams(n=3, stop=("stop",)))
    choices = _by_choice([c async for c in core.generate(prepared)])
    assert sorted(choices) == [0, 1, 2]
    texts = {i: "".join(c.text for c in chunks) for i, chunks in choices.items()}
    assert texts == {0: "Red apples ", 1: ANSWERS[1], 2: "Blue plums "}
    finals = {i: chunks[-1] for i, chunks in choices.items()}
    assert all(c.final for c in finals.values()) and sum(c.final for cs in choices.values() for c in cs) == 3
    assert (finals[0].finish_reason, finals[0].stop_reason) == (FinishReason.STOP, "stop")
    assert finals[1].finish_reason is FinishReason.LENGTH and finals[1].usage.completion_tokens == len(answers[1])
    prompt_len = engine.requests[0].prompt_len
    for i in (0, 2):  # each counts its own tokens, up to the one that completed its stop string
        assert finals[i].usage == Usage(prompt_len, sum(len(c.token_ids) for c in choices[i]))
    # choice 0 stopped early: the engine's later tokens of it were dropped, while choices 1 and 2 went on
    assert sum(len(c.token_ids) for c in choices[0]) < engine.sent[0] == len(answers[0]) < len(answers[1])


async def test_the_engine_call_ends_when_every_choice_has_stopped(tiny):
    files, info = tiny["tiny-text"]
    answers = [files.tokenizer(ANSWERS[i], add_special_tokens=False)["input_ids"] * 20 for i in (0, 2)]
    engine = ChoicesEngine(answers)
    core = PreprocessorCore(files, info, engine)
    chunks = await chat_chunks(core, conversation(("user", "Hi")), SamplingParams(n=2, stop=("stop",)))
    assert [c.index for c in chunks if c.final] in ([0, 1], [1, 0])
    assert engine.closed.is_set() and max(engine.sent) < len(answers[0])  # cancelled, not read to the end


async def test_batch_choices_are_numbered_prompt_times_n_plus_choice(tiny):
    files, info = tiny["tiny-text"]
    answers = [files.tokenizer(a, add_special_tokens=False)["input_ids"] for a in ANSWERS[:2]]
    core = PreprocessorCore(files, info, ChoicesEngine(answers))
    prompts = [[Text(p, Where(None, i))] for i, p in enumerate(("One", "Two", "Three"))]
    prepared = await core.prepare_complete(prompts, SamplingParams(n=2))
    assert prepared.choices == 6
    seen: dict[int, str] = {}
    async for index, chunk in core.generate(prepared):
        assert index % 2 == chunk.index
        seen[index] = seen.get(index, "") + chunk.text
    assert seen == {p * 2 + j: ANSWERS[j] for p in range(3) for j in range(2)}


async def test_a_whole_answer_charges_n_times_max_tokens_to_admission(tiny_dirs, tiny):
    """A non-streamed answer is held until it is sent: n x max_tokens tokens of it are charged before any is made."""
    per_token = ChatShape.TOKEN_BYTES
    admission = Admission(max_concurrent=4, max_bytes=3000 * per_token)
    async with http_face(tiny_dirs, tiny, admission=admission) as face:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1000}
        served = await face.http.post("/v1/chat/completions", json=body)  # 1 x 1000 tokens fit
        assert served.status_code == 200, served.text
        refused = await face.http.post("/v1/chat/completions", json={**body, "n": 4})  # 4 x 1000 never do
        assert refused.status_code == 429 and "n x max_tokens" in refused.text, refused.text
        assert "--max-inflight-request-bytes" in refused.text and len(face.engine.requests) == 1  # never reached it
        for _ in range(500):  # each request gives its charge back once its response is sent
            if admission.held == 0 and admission.running == 0:
                break
            await asyncio.sleep(0.01)
        assert admission.held == 0 and admission.running == 0


async def test_a_whole_answer_charges_each_choices_copy_of_the_prompt_logprobs(tiny_dirs, tiny):
    """vLLM's completions show a prompt's logprobs on each of its n choices: a whole answer holds n copies, charged
    with the list itself before the engine is reached (n = 4 refused where n = 1 fits; its 4 x 1 tokens alone would)."""
    files, _ = tiny["tiny-text"]
    prompt = " ".join(["red green blue"] * 40)
    positions = len(files.tokenizer(prompt)["input_ids"])

    def held(n: int) -> int:  # per position with prompt_logprobs 20
        return Shape.PROMPT_POSITION_BYTES + 20 * Shape.PROMPT_ALTERNATIVE_BYTES + \
            n * (Shape.PROMPT_COPY_BYTES + 20 * Shape.PROMPT_COPY_ALTERNATIVE_BYTES)

    admission = Admission(max_concurrent=4, max_bytes=positions * (held(1) + held(4)) // 2)
    async with http_face(tiny_dirs, tiny, admission=admission) as face:
        body = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 20}
        served = await face.http.post("/v1/completions", json=body)
        assert served.status_code == 200, served.text
        refused = await face.http.post("/v1/completions", json={**body, "n": 4})
        assert refused.status_code == 429 and f"prompt logprobs of {positions} positions" in refused.text, \
            refused.text
        assert len(face.engine.requests) == 1  # the refused one never reached it
