"""The requests bench/vs_vllm_api.py sends to vLLM and to Splice: chat and completions, streamed and not, logprobs,
stop strings and stop_token_ids, grammars, n, echo, token IDs, prompt embeddings, the other routes, and requests
either server must refuse. Every generating request is greedy (temperature 0), so both answer the same tokens on
the same weights."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import torch

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HIDDEN = 576  # SmolLM2-135M's hidden size: the prompt_embeds cases' row width


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: dict | None = None  # None: a GET; {"__raw__": TEXT}: TEXT sent as the body as it is
    parser: bool = False  # asked only of servers running a tool parser (vs_vllm_api --tool-call-parser)

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _embeds(rows: int, seed: int = 0) -> str:
    """vLLM's prompt_embeds encoding (base64 of torch.save) of `rows` small random rows."""
    buffer = io.BytesIO()
    torch.save(torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(seed)) * 0.02, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


COUNT = _user("Count from 1 to 10, separated by commas.")
FRANCE = _user("What is the capital of France?")
ACCENT = _user("Repeat exactly: À la coupe du monde")
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat(name: str, messages: list[dict], parser: bool = False, **fields) -> Case:
    return Case(name, CHAT, {"messages": messages, "temperature": 0, "max_tokens": 16, **fields}, parser)


def complete(name: str, prompt, **fields) -> Case:
    """`prompt` None: none sent (prompt_embeds alone; vLLM refuses an empty prompt beside them, Splice drops it)."""
    body = {"temperature": 0, "max_tokens": 16, **fields}
    return Case(name, COMPLETIONS, body if prompt is None else {"prompt": prompt, **body})


def corpus() -> list[Case]:
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    cases = [
        # -- chat -----------------------------------------------------------------------------------------------
        chat("chat", FRANCE),
        chat("chat stream", FRANCE, stream=True),
        chat("chat stream usage", FRANCE, **usage),
        chat("chat stream continuous usage", FRANCE, stream=True,
             stream_options={"include_usage": True, "continuous_usage_stats": True}),
        chat("chat logprobs top 5", FRANCE, logprobs=True, top_logprobs=5, max_tokens=6),
        chat("chat logprobs stream", FRANCE, logprobs=True, top_logprobs=2, max_tokens=6, stream=True),
        chat("chat partial utf-8 logprobs", ACCENT, logprobs=True, top_logprobs=5, max_tokens=4),
        chat("chat partial utf-8 logprobs stream", ACCENT, logprobs=True, top_logprobs=3, max_tokens=4, stream=True),
        chat("chat stop string", COUNT, stop=[", 4"], max_tokens=30),
        chat("chat stop string kept", COUNT, stop=[", 4"], include_stop_str_in_output=True, max_tokens=30),
        chat("chat stop string stream", COUNT, stop=[", 4"], max_tokens=30, stream=True),
        chat("chat stop_token_ids", COUNT, stop_token_ids=[28], max_tokens=30),
        chat("chat stop_token_ids stream", COUNT, stop_token_ids=[28], max_tokens=30, **usage),
        chat("chat stop_token_ids kept", COUNT, stop_token_ids=[28], include_stop_str_in_output=True),
        chat("chat stop_token_ids logprobs", COUNT, stop_token_ids=[28], logprobs=True, top_logprobs=1),
        chat("chat eos in stop_token_ids", FRANCE, stop_token_ids=[2], max_tokens=40),
        chat("chat eos text kept", FRANCE, skip_special_tokens=False, max_tokens=40),
        chat("chat length", FRANCE, max_tokens=3),
        chat("chat max_completion_tokens", FRANCE, max_completion_tokens=4),
        # n > 1: sampled (vLLM refuses it greedy), from the one most likely token (top_k 1), so still one answer
        chat("chat n=2", FRANCE, n=2, max_tokens=5, temperature=1, top_k=1),
        chat("chat n=2 stream", FRANCE, n=2, max_tokens=5, temperature=1, top_k=1, **usage),
        chat("chat json_schema", FRANCE, max_tokens=30,
             response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": CITY}}),
        chat("chat json_schema stream", FRANCE, max_tokens=30, stream=True,
             response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": CITY}}),
        chat("chat json_object", FRANCE, max_tokens=30, response_format={"type": "json_object"}),
        chat("chat structured_outputs json", FRANCE, max_tokens=30, structured_outputs={"json": CITY}),
        chat("chat choice", FRANCE, structured_outputs={"choice": ["Paris", "Lyon"]}),
        chat("chat regex", FRANCE, structured_outputs={"regex": "[A-Z][a-z]+"}),
        chat("chat prompt_logprobs", FRANCE, prompt_logprobs=2, max_tokens=3),
        chat("chat return_token_ids", FRANCE, return_token_ids=True, max_tokens=4),
        chat("chat return_token_ids stream", FRANCE, return_token_ids=True, max_tokens=4, stream=True),
        chat("chat return_tokens_as_token_ids", FRANCE, logprobs=True, top_logprobs=2, max_tokens=4,
             return_tokens_as_token_ids=True),
        chat("chat return_tokens_as_token_ids stream", ACCENT, logprobs=True, top_logprobs=2, max_tokens=4,
             return_tokens_as_token_ids=True, stream=True),
        chat("chat echo", [*FRANCE, {"role": "assistant", "content": "The capital"}], echo=True,
             add_generation_prompt=False, continue_final_message=True, max_tokens=6),
        chat("chat continue_final_message", [*FRANCE, {"role": "assistant", "content": "The capital"}],
             add_generation_prompt=False, continue_final_message=True, max_tokens=6),
        chat("chat tool_choice none", _user("Weather in Paris?"), tools=[WEATHER], tool_choice="none",
             max_tokens=8),
        # with a tool parser only (vLLM refuses these without one; Splice serves required and named choices without
        # one too). vLLM 0.32 then writes required and named calls in the parser's own format, under a structural
        # tag; Splice constrains them with vLLM's JSON schemas of the calls (docs/api.md: their answers differ)
        chat("chat tool_choice auto", _user("What is the weather in Paris? Use the tool."), parser=True,
             tools=[WEATHER], tool_choice="auto", max_tokens=64),
        chat("chat tool_choice auto stream", _user("What is the weather in Paris? Use the tool."), parser=True,
             tools=[WEATHER], tool_choice="auto", max_tokens=64, stream=True),
        chat("chat tool_choice required", _user("Weather in Paris?"), parser=True, tools=[WEATHER],
             tool_choice="required", max_tokens=64),
        chat("chat tool_choice named", _user("Weather in Paris?"), parser=True, tools=[WEATHER], max_tokens=64,
             tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        chat("chat system", [{"role": "system", "content": "You are brief."}, *FRANCE]),
        chat("chat seed", FRANCE, seed=7, max_tokens=4),
        chat("chat logit_bias", FRANCE, logit_bias={"28": -100}, max_tokens=6),
        # (a message of prompt embeddings alone: vLLM moves them before a message's text, Splice keeps them in place)
        chat("chat prompt_embeds", [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": [{"type": "prompt_embeds", "data": _embeds(3)}]}],
             max_tokens=6),
        chat("chat prompt_embeds stream", [{"role": "user", "content": [{"type": "prompt_embeds",
                                                                          "data": _embeds(5, 3)}]}],
             max_tokens=6, stream=True),
        chat("chat echo stream", [*FRANCE, {"role": "assistant", "content": "The capital"}], echo=True,
             add_generation_prompt=False, continue_final_message=True, max_tokens=6, stream=True),
        chat("chat logprob_token_ids", FRANCE, logprobs=True, logprob_token_ids=[504, 28, 2], max_tokens=4),
        chat("chat top_logprobs 0", FRANCE, logprobs=True, top_logprobs=0, max_tokens=3),
        chat("chat penalties", COUNT, presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.3,
             max_tokens=20),
        chat("chat min_p", FRANCE, min_p=0.5, max_tokens=8),
        chat("chat bad_words", FRANCE, bad_words=["Paris"], max_tokens=12),
        chat("chat allowed_token_ids", FRANCE, allowed_token_ids=[504, 3575, 282, 2], max_tokens=5),
        chat("chat stop kept stream", COUNT, stop=[", 4"], include_stop_str_in_output=True, max_tokens=30,
             stream=True),
        chat("chat min_tokens past a stop token", COUNT, stop_token_ids=[28], min_tokens=4, max_tokens=12),
        # max_tokens within the context, past what the prompt leaves of it (2031 of 2048): the answer ends there
        chat("chat ends at the context", [{"role": "user", "content": "word " * 2000}], max_tokens=40),
        # -- completions ----------------------------------------------------------------------------------------
        complete("completion", "The capital of France is"),
        complete("completion stream", "The capital of France is", stream=True),
        complete("completion stream usage", "The capital of France is", **usage),
        complete("completion stream continuous usage", "The capital of France is", stream=True,
                 stream_options={"include_usage": True, "continuous_usage_stats": True}),
        complete("completion logprobs 3", "The capital of France is", logprobs=3, max_tokens=5),
        complete("completion logprobs stream", "The capital of France is", logprobs=2, max_tokens=5, stream=True),
        complete("completion echo logprobs", "The capital of France is", echo=True, logprobs=1, max_tokens=3),
        complete("completion echo max_tokens 0", "The capital of France is", echo=True, logprobs=1, max_tokens=0),
        complete("completion partial utf-8 echo", "À la coupe", echo=True, logprobs=2, max_tokens=3),
        complete("completion partial utf-8 prompt_logprobs", "À la coupe du monde", prompt_logprobs=2,
                 max_tokens=2),
        complete("completion token ids", [504, 3575, 282, 4649, 314], max_tokens=6),
        complete("completion batch", ["The capital of France is", "Once upon a time"], max_tokens=5),
        complete("completion batch stream", ["The capital of France is", "Once upon a time"], max_tokens=5,
                 **usage),
        complete("completion n=2", "The capital of France is", n=2, max_tokens=4, temperature=1, top_k=1),
        complete("completion stop string", "1, 2, 3,", stop=[" 6"], max_tokens=30),
        complete("completion stop_token_ids", "1, 2, 3,", stop_token_ids=[28], max_tokens=30),
        complete("completion stop_token_ids stream", "1, 2, 3,", stop_token_ids=[28], max_tokens=30, stream=True),
        complete("completion stop_token_ids logprobs", "1, 2, 3,", stop_token_ids=[28], logprobs=1),
        complete("completion ignore_eos", "The capital of France is", ignore_eos=True, max_tokens=8),
        complete("completion min_tokens", "1, 2, 3,", stop_token_ids=[28], min_tokens=3, max_tokens=10),
        complete("completion json", "A JSON object about Paris:", structured_outputs={"json": CITY},
                 max_tokens=30),
        complete("completion grammar", "Answer yes or no:", structured_outputs={"grammar": 'root ::= "yes" | "no"'}),
        complete("completion prompt_logprobs", "The capital of France is", prompt_logprobs=1, max_tokens=2),
        complete("completion return_token_ids", "The capital of France is", return_token_ids=True, max_tokens=3),
        complete("completion return_token_ids stream", "The capital of France is", return_token_ids=True,
                 max_tokens=3, stream=True),
        complete("completion return_tokens_as_token_ids", "The capital of France is", logprobs=2, max_tokens=3,
                 return_tokens_as_token_ids=True),
        complete("completion echo return_tokens_as_token_ids", "The capital", echo=True, logprobs=1, max_tokens=2,
                 return_tokens_as_token_ids=True),
        complete("completion prompt_embeds", None, prompt_embeds=_embeds(4), max_tokens=5),
        complete("completion prompt_embeds batch", None, prompt_embeds=[_embeds(2, 1), _embeds(3, 2)], max_tokens=3),
        complete("completion prompt_embeds logprobs", None, prompt_embeds=_embeds(4), logprobs=2, max_tokens=3),
        complete("completion logprobs 0", "The capital of France is", logprobs=0, max_tokens=3),
        complete("completion echo stream", "The capital of France is", echo=True, logprobs=1, max_tokens=3,
                 stream=True),
        complete("completion echo prompt_logprobs", "The capital", echo=True, prompt_logprobs=2, max_tokens=2),
        complete("completion token id batch", [[504, 3575, 282], [19556, 905]], max_tokens=4),
        complete("completion logprob_token_ids", "The capital of France is", logprobs=1,
                 logprob_token_ids=[7042, 28], max_tokens=3),
        complete("completion special tokens kept", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                 skip_special_tokens=False, max_tokens=30),
        complete("completion stop string min_tokens", "1, 2, 3,", stop=[","], min_tokens=3, max_tokens=12),
        # -- other routes ---------------------------------------------------------------------------------------
        Case("models", "/v1/models"),
        Case("tokenize", "/tokenize", {"prompt": "Hello world"}),
        Case("tokenize chat", "/tokenize", {"messages": FRANCE}),
        Case("detokenize", "/detokenize", {"tokens": [19556, 905]}),
        Case("tokenize token strings", "/tokenize", {"prompt": "À la", "return_token_strs": True}),
        # -- refused --------------------------------------------------------------------------------------------
        complete("error empty prompt", ""),
        complete("error unknown model", "Hi", model="nosuch"),
        complete("error temperature", "Hi", temperature=-1),
        complete("error top_p", "Hi", top_p=2),
        complete("error max_tokens past the context", "Hi", max_tokens=10_000_000),
        chat("error chat max_tokens past the context", FRANCE, max_tokens=10_000_000),
        complete("error stop_token_ids out of vocabulary", "Hi", stop_token_ids=[99999]),
        chat("error chat stop_token_ids out of vocabulary", FRANCE, stop_token_ids=[99999]),
        complete("error stream_options without stream", "Hi", stream_options={"include_usage": True}),
        chat("error chat stream_options without stream", FRANCE, stream_options={"include_usage": True}),
        complete("error logit_bias out of vocabulary", "Hi", logit_bias={"99999": 1}),
        complete("error n=0", "Hi", n=0),
        complete("error logprobs 21", "Hi", logprobs=21),
        complete("error prompt_embeds not base64", None, prompt_embeds="!!!"),
        chat("error tool_choice required without tools", FRANCE, tool_choice="required"),
        chat("error messages missing", [], max_tokens=4),
        Case("error chat body not JSON", CHAT, {"__raw__": "{not json"}),
        Case("error unknown route", "/v1/nosuch", {}),
        Case("error method not allowed", CHAT),
        complete("error max_tokens not a number", "Hi", max_tokens="many"),
        chat("error messages not a list", "Hi"),
        chat("error top_logprobs without logprobs", FRANCE, top_logprobs=2),
        complete("error max_tokens 0 without echo", "Hi", max_tokens=0),
        complete("error prompt past the context", "word " * 2100, max_tokens=4),
        chat("error regex", FRANCE, structured_outputs={"regex": "[a-"}),
        chat("error two constraints", FRANCE, structured_outputs={"regex": "a"},
             response_format={"type": "json_object"}),
        complete("error min_p", "Hi", min_p=2),
        complete("error presence_penalty", "Hi", presence_penalty=3),
    ]
    return cases
