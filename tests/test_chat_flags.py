"""`splice chat`'s flags become the client's keywords (and so the SamplingParams and ChatRequest the server
checks), under vLLM's field names."""

from __future__ import annotations

import pytest

from app.cli import build_parser, chat_fields, chat_sampling
from clients.requests import chat_request
from splice.sampling import SamplingParams


def _args(*flags: str):
    return build_parser().parse_args(["chat", "Hi", *flags])


def _sampling(*flags: str) -> dict:
    return chat_sampling(_args(*flags))


def test_defaults_send_only_temperature_and_max_tokens():
    assert _sampling() == {"temperature": 0.0, "max_tokens": 64}
    assert chat_fields(_args()) == {}


def test_every_control_flag_reaches_sampling_params():
    got = _sampling("--seed", "3", "--top-p", "0.9", "--top-k", "5", "--presence-penalty", "0.5",
                    "--frequency-penalty", "-1", "--repetition-penalty", "1.2", "--min-p", "0.1", "--min-tokens", "4",
                    "--logit-bias", "50=-100", "--logit-bias", "7=2.5", "--bad-words", "red", "--bad-words", "blue",
                    "--stop", "END", "--include-stop-str-in-output", "--allowed-token-ids", "1,2,3",
                    "--stop-token-ids", "9", "--ignore-eos", "--no-skip-special-tokens", "--top-logprobs", "5",
                    "--n", "3", "--cache-salt", "tenant-a")
    p = SamplingParams(**got)
    assert (p.seed, p.top_p, p.top_k, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p,
            p.min_tokens) == (3, 0.9, 5, 0.5, -1.0, 1.2, 0.1, 4)
    assert p.logit_bias == ((7, 2.5), (50, -100.0)) and p.bad_words == ("red", "blue")
    assert p.stop == ("END",) and p.include_stop_str_in_output and p.n == 3 and p.cache_salt == "tenant-a"
    assert p.allowed_token_ids == (1, 2, 3) and p.stop_token_ids == (9,) and p.ignore_eos
    assert not p.skip_special_tokens and p.logprobs and p.top_logprobs == 5  # (top_logprobs implies logprobs)
    assert SamplingParams(**_sampling("--logprobs")).logprobs
    p = SamplingParams(**_sampling("--prompt-logprobs", "0", "--logprob-token-ids", "4,5"))
    assert p.prompt_logprobs == 0 and p.logprob_token_ids == (4, 5) and p.logprobs  # (the list implies logprobs)


def test_structured_output_flags_reach_the_request():
    from splice.v1 import common_pb2

    pb = chat_request([], **_sampling("--structured-outputs", '{"choice": ["yes", "no"]}')).sampling.structured
    assert pb.kind == common_pb2.StructuredOutput.KIND_CHOICE and pb.spec == '["yes", "no"]'
    pb = chat_request([], **_sampling("--response-format", '{"type": "json_object"}')).sampling.structured
    assert pb.kind == common_pb2.StructuredOutput.KIND_JSON_OBJECT


def test_every_chat_field_flag_reaches_the_chat_request():
    fields = chat_fields(_args("--continue-final-message", "--add-special-tokens", "--documents",
                               '[{"title": "Moon", "text": "rock"}]', "--reasoning-effort", "low",
                               "--chat-template-kwargs", '{"enable_thinking": false}',
                               "--mm-processor-kwargs", '{"max_pixels": 1024}', "--tools",
                               '[{"type": "function", "function": {"name": "f"}}]', "--tool-choice", "f",
                               "--no-parallel-tool-calls"))
    req = chat_request([{"role": "user", "content": "Hi"}], **fields)
    assert req.continue_final_message and not req.add_generation_prompt and req.add_special_tokens
    assert [dict(d) for d in req.documents] == [{"title": "Moon", "text": "rock"}]
    assert req.reasoning_effort == "low" and req.chat_template_kwargs["enable_thinking"] is False
    assert req.mm_processor_kwargs["max_pixels"] == 1024
    assert [dict(t)["function"]["name"] for t in req.tools] == ["f"] and req.parallel_tool_calls is False
    assert req.tool_choice.struct_value["function"]["name"] == "f"
    assert chat_request([], **chat_fields(_args("--tool-choice", "required"))).tool_choice.string_value == "required"


@pytest.mark.parametrize(("flags", "needle"), [
    (("--logit-bias", "50:-1"), "TOKEN_ID=BIAS"),
    (("--allowed-token-ids", "1,x"), "separated by commas"),
    (("--documents", '{"title": "x"}'), "expected a JSON array"),
    (("--mm-processor-kwargs", "{max_pixels: 3}"), "not JSON"),
    (("--reasoning-effort", "extreme"), "invalid choice"),
])
def test_a_malformed_flag_is_a_usage_error(capsys, flags, needle):
    with pytest.raises(SystemExit) as exit_:
        _args(*flags)
    assert exit_.value.code == 2 and needle in capsys.readouterr().err


def test_prompt_logprobs_are_printed_per_prompt_token(capsys):
    from app.cli import print_prompt_logprobs
    from clients.types import Chunk
    from splice.prompt_logprobs import PromptLogprobs

    plp = PromptLogprobs((7, 8, 9), (-1.5, -0.25), (3, 1), (4, 8), (-0.5, -0.25))
    print_prompt_logprobs([Chunk("a", (1,), prompt_logprobs=plp), Chunk("b", (2,))])
    assert capsys.readouterr().err.splitlines() == [
        "prompt token 7 (first: no logprob)",
        "prompt token 8 logprob=-1.5000 rank=3  top: 4:-0.5000",
        "prompt token 9 logprob=-0.2500 rank=1  top: 8:-0.2500",
    ]
