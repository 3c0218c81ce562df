"""No field of vLLM's request bodies is accepted and dropped: each field of vLLM 0.33.0's ChatCompletionRequest and
CompletionRequest (the lists below, copied from its source) is honoured (a field of our schema, read by the
route), refused at any value that asks for something (a 400 naming it: convert.UNHONOURED, convert.NOT_SERVED),
or has no effect on what vLLM serves either (INERT)."""

from __future__ import annotations

import pytest

from preprocessor.http.convert import NOT_SERVED, UNHONOURED, check_served
from preprocessor.http.schemas import ChatCompletionRequest, CompletionRequest
from splice.errors import InvalidArgument
from tests.preprocessor.http_face import http_face

# vllm/entrypoints/openai/chat_completion/protocol.py and completion/protocol.py of vLLM 0.33.0, in their order.
VLLM_CHAT_FIELDS = (
    "messages", "model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
    "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream", "stream_options",
    "temperature", "top_p", "tools", "tool_choice", "reasoning_effort", "thinking_token_budget", "include_reasoning",
    "parallel_tool_calls", "user", "use_beam_search", "top_k", "min_p", "repetition_penalty", "watermarking",
    "length_penalty", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
    "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "truncation_side",
    "prompt_logprobs", "logprob_token_ids", "allowed_token_ids", "bad_words", "echo", "add_generation_prompt",
    "continue_final_message", "add_special_tokens", "documents", "chat_template", "chat_template_kwargs",
    "media_io_kwargs", "mm_processor_kwargs", "structured_outputs", "priority", "request_id", "session_id",
    "return_tokens_as_token_ids", "return_token_ids", "return_weight_versions", "routed_experts_prompt_start",
    "return_token_offsets", "return_prompt_text", "mm_payload", "return_mm_kwargs", "cache_salt",
    "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "repetition_detection", "stream_interval",
)
VLLM_COMPLETION_FIELDS = (
    "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
    "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user", "use_beam_search", "top_k",
    "min_p", "repetition_penalty", "watermarking", "length_penalty", "stop_token_ids", "include_stop_str_in_output",
    "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "truncation_side", "allowed_token_ids", "prompt_logprobs", "logprob_token_ids", "bad_words", "prompt_embeds",
    "add_special_tokens", "response_format", "structured_outputs", "priority", "request_id", "session_id",
    "return_tokens_as_token_ids", "return_token_ids", "return_weight_versions", "routed_experts_prompt_start",
    "return_token_offsets", "mm_payload", "return_mm_kwargs", "cache_salt", "kv_transfer_params",
    "ec_transfer_params", "vllm_xargs", "repetition_detection", "thinking_token_budget", "stream_interval",
)
# Fields that change nothing vLLM serves here, and why.
INERT = {
    "user": "vLLM ignores it (its own comment: 'NOTE this will be ignored by vLLM')",
    "session_id": "routing and cache identity only",
    "include_reasoning": "acts through a reasoning parser; there is none (vLLM without --reasoning-parser: no effect)",
}
ASKING = {  # a value of each NOT_SERVED field that asks for something
    "priority": 5, "thinking_token_budget": 64,
    "repetition_detection": {"max_pattern_size": 8}, "media_io_kwargs": {"image": {"mode": "L"}},
    "truncation_side": "left", "watermarking": True, "return_token_offsets": True,
    "return_prompt_text": True, "return_weight_versions": True, "return_mm_kwargs": True, "mm_payload": "none",
    "routed_experts_prompt_start": 3, "kv_transfer_params": {"do_remote_prefill": True},
    "ec_transfer_params": {"x": 1}, "vllm_xargs": {"k": "v"}, "stream_interval": 4,
}
HI = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(("schema", "fields"), [(ChatCompletionRequest, VLLM_CHAT_FIELDS),
                                                 (CompletionRequest, VLLM_COMPLETION_FIELDS)])
def test_every_vllm_field_is_honoured_refused_or_inert(schema, fields):
    declared = set(schema.model_fields)
    refused = set(UNHONOURED) | set(NOT_SERVED)
    assert not declared & refused, "a field is read or refused, not both"
    assert not set(INERT) & (declared | refused)
    dropped = [f for f in fields if f not in declared | refused | set(INERT)]
    assert not dropped, f"vLLM fields accepted and ignored: {dropped}"


def test_every_not_served_field_has_a_case():
    assert set(ASKING) == set(NOT_SERVED)


@pytest.mark.parametrize("name", sorted(ASKING))
def test_a_not_served_field_that_asks_is_refused_by_name(name):
    for body in (ChatCompletionRequest(messages=HI, **{name: ASKING[name]}),
                 CompletionRequest(prompt="Hi", **{name: ASKING[name]})):
        with pytest.raises(InvalidArgument, match=f"^{name} is not supported"):
            check_served(body)
    off = NOT_SERVED[name]
    check_served(CompletionRequest(prompt="Hi", **{name: off[0] if off else None}))


async def test_refusals_and_inert_fields_over_http(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, "tiny-text") as face:
        for route, body in (("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {"prompt": "Hi"})):
            r = await face.http.post(route, json={**body, "max_tokens": 2, "priority": 5})
            assert r.status_code == 400 and "priority is not supported" in r.json()["error"]["message"]
            r = await face.http.post(route, json={**body, "max_tokens": 2, "priority": 0, "user": "u",
                                                  "session_id": "s", "include_reasoning": False})
            assert r.status_code == 200, r.text
        assert len(face.engine.requests) == 2
