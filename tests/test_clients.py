"""Client-side request building: Python values become the right content parts and sampling fields."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from clients.parts import image_part, message, to_part
from clients.requests import chat_request, complete_request
from clients.types import Chunk
from splice.tensors import tensor_from_pb
from splice.v1 import common_pb2
from splice.v1 import preprocessor_pb2 as pp


def test_message_parts_from_python_values(tmp_path):
    img = Image.new("RGB", (5, 4), (10, 20, 30))
    path = tmp_path / "x.png"
    img.save(path)
    embeds = torch.randn(3, 8)
    m = message("user", ["hello", img, embeds, {"type": "image", "image": str(path)}, "bye"])
    kinds = [p.WhichOneof("kind") for p in m.content]
    assert kinds == ["text", "image", "prompt_embeds", "image", "text"]
    assert torch.equal(tensor_from_pb(m.content[2].prompt_embeds.tensor), embeds)
    assert Image.open(io.BytesIO(m.content[1].image.data)).size == (5, 4)
    assert m.content[3].image.data == path.read_bytes()
    assert image_part(str(path), as_path=True).image.path == str(path)
    assert image_part("data:image/png;base64,AAAA").image.url.startswith("data:")
    assert message("system", "be brief").text == "be brief"
    with pytest.raises(ValueError, match="unknown content part"):
        to_part({"type": "audio"})


def test_chat_request_sampling_and_template_fields():
    req = chat_request([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=5, stop=["\n"],
                       add_generation_prompt=False, chat_template="{{ 1 }}", chat_template_kwargs={"flag": True})
    assert req.sampling.HasField("temperature") and req.sampling.temperature == 0.0
    assert req.sampling.max_tokens == 5 and list(req.sampling.stop) == ["\n"]
    assert req.add_generation_prompt is False and req.HasField("chat_template")
    assert req.chat_template_kwargs["flag"] is True
    # unset optionals stay unset, so the server applies its defaults
    assert not chat_request([]).HasField("add_generation_prompt")


# Every SamplingParams field a caller sets, by vLLM's HTTP name, at a value off its default (floats exact in float32).
VLLM_SAMPLING = {"temperature": 0.5, "top_p": 0.75, "top_k": 5, "seed": 7, "max_tokens": 9, "stop": ["END"],
                 "stop_token_ids": [3], "ignore_eos": True, "logprobs": True, "top_logprobs": 4,
                 "skip_special_tokens": False, "presence_penalty": 0.5, "frequency_penalty": -1.0,
                 "repetition_penalty": 1.25, "min_p": 0.125, "min_tokens": 2, "logit_bias": {"50": -100.0},
                 "allowed_token_ids": [1, 2], "bad_words": ["red"], "include_stop_str_in_output": True,
                 "prompt_logprobs": 3, "logprob_token_ids": [5, 6, 7, 8], "n": 3, "cache_salt": "tenant-a"}


def test_every_sampling_field_reaches_the_request_by_vllms_name():
    # (structured: set by vLLM's structured-output fields, test_structured_outputs_reach_the_request_by_vllms_names)
    settable = {f.name for f in common_pb2.SamplingParams.DESCRIPTOR.fields} - {"bad_words_token_ids", "structured"}
    assert set(VLLM_SAMPLING) == settable  # (a new field joins this test)
    pb = chat_request([{"role": "user", "content": "hi"}], **VLLM_SAMPLING).sampling
    for name, value in VLLM_SAMPLING.items():
        got = getattr(pb, name)
        if name == "logit_bias":
            assert dict(got) == {50: -100.0}
        elif isinstance(value, list):
            assert list(got) == value, name
        else:
            assert got == value, name
    # vLLM's spellings: one stop string, top_k -1 for off
    pb = chat_request([], stop="END", top_k=-1).sampling
    assert list(pb.stop) == ["END"] and pb.top_k == 0


def test_chat_request_carries_vllms_chat_fields():
    docs = [{"title": "Moon", "text": "rock"}]
    req = chat_request([{"role": "user", "content": "hi"}], add_generation_prompt=False, continue_final_message=True,
                       add_special_tokens=True, documents=docs, reasoning_effort="low",
                       mm_processor_kwargs={"max_pixels": 1024})
    assert req.continue_final_message and req.add_special_tokens and req.reasoning_effort == "low"
    assert [dict(d) for d in req.documents] == docs and req.mm_processor_kwargs["max_pixels"] == 1024
    plain = chat_request([])
    assert not (plain.continue_final_message or plain.add_special_tokens or plain.documents)
    assert not plain.HasField("reasoning_effort") and not plain.HasField("mm_processor_kwargs")


def test_complete_request_parts():
    req = complete_request([[1, 2, 3], "text", torch.zeros(2, 4)])
    assert [p.WhichOneof("kind") for p in req.prompt] == ["token_ids", "text", "prompt_embeds"]
    assert list(req.prompt[0].token_ids.ids) == [1, 2, 3]


def test_chunk_from_pb_final():
    pb = pp.GenerationChunk(text="x", token_ids=[4], finish_reason=common_pb2.FINISH_REASON_LENGTH,
                            usage=common_pb2.Usage(prompt_tokens=7, completion_tokens=1))
    chunk = Chunk.from_pb(pb)
    assert chunk.finish_reason == "length" and chunk.usage.prompt_tokens == 7
    assert Chunk.from_pb(pp.GenerationChunk(text="y")).finish_reason is None


def test_complete_takes_the_content_part_and_prompt_embeds_forms():
    b64 = pp.PromptEmbeds(torch_base64="AAAA")
    req = complete_request([[5, 6], pp.ContentPart(prompt_embeds=b64), b64])
    assert [p.WhichOneof("kind") for p in req.prompt] == ["token_ids", "prompt_embeds", "prompt_embeds"]
    assert req.prompt[1].prompt_embeds.torch_base64 == "AAAA"
    with pytest.raises(TypeError, match="images need Chat"):
        complete_request([pp.ContentPart(image=pp.ImageInput(data=b"x"))])


def test_structured_outputs_reach_the_request_by_vllms_names():
    from splice.structured_output import StructuredOutput

    def sent(**fields):
        pb = chat_request([{"role": "user", "content": "hi"}], **fields).sampling.structured
        return common_pb2.StructuredOutput.Kind.Name(pb.kind), pb.spec

    assert sent(structured_outputs={"regex": "a+"}) == ("KIND_REGEX", "a+")
    assert sent(guided_choice=["x", "y"]) == ("KIND_CHOICE", '["x", "y"]')
    assert sent(response_format={"type": "json_object"}) == ("KIND_JSON_OBJECT", "")
    assert sent(structured=StructuredOutput("grammar", 'root ::= "a"')) == ("KIND_GRAMMAR", 'root ::= "a"')
    assert not chat_request([]).sampling.HasField("structured")


@pytest.mark.parametrize("sampling", [{"guided_regex": "a", "guided_json": {}}, {"guided_choice": []},
                                      {"response_format": {"type": "xml"}}])
def test_bad_structured_fields_are_the_client_error_the_server_gives(sampling):
    import grpc

    from clients import SpliceClientError

    with pytest.raises(SpliceClientError) as err:
        chat_request([{"role": "user", "content": "hi"}], **sampling)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and next(iter(sampling)) in err.value.details


@pytest.mark.parametrize("sampling", [{"temperature": -1}, {"top_p": 0}, {"top_k": -5}, {"max_tokens": 0}])
def test_bad_sampling_is_the_same_client_error_the_server_gives(sampling):
    import grpc

    from clients import SpliceClientError

    with pytest.raises(SpliceClientError) as err:
        chat_request([{"role": "user", "content": "hi"}], **sampling)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and next(iter(sampling)) in err.value.details


def test_unsendable_values_raise_the_client_error_type(tmp_path):
    import grpc

    from clients import SpliceClientError

    for build in (lambda: chat_request([{"role": "user", "content": [torch.zeros(2, 4, dtype=torch.complex64)]}]),
                  lambda: complete_request([torch.zeros(2, 4, dtype=torch.complex64)]),
                  lambda: chat_request([{"role": "user", "content": [{"type": "image",
                                                                       "image": str(tmp_path / "none.png")}]}])):
        with pytest.raises(SpliceClientError) as err:
            build()
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "complex64" in str(err.value) or "none.png" in str(err.value)


@pytest.mark.parametrize("content", [None, b"not safetensors"])
def test_splice_chat_with_a_missing_or_corrupt_file_prints_one_line(tmp_path, capsys, content):
    from app.cli import main

    path = tmp_path / "soft.safetensors"
    if content is not None:
        path.write_bytes(content)
    assert main(["chat", "Hi", "--target", "127.0.0.1:1", "--embeds", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0], err
    image = tmp_path / "missing.png"
    assert main(["chat", "Hi", "--target", "127.0.0.1:1", "--image", str(image)]) == 2  # as a missing --embeds file
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.png" in err[0], err


def test_tokenize_passes_add_special_tokens_to_the_conversation():
    from clients.requests import tokenize_request

    req = tokenize_request([{"role": "user", "content": "hi"}], add_special_tokens=True)
    assert req.chat.add_special_tokens and not req.HasField("add_special_tokens")
    req = tokenize_request(None, text="hi", add_special_tokens=False)
    assert req.HasField("add_special_tokens") and not req.add_special_tokens
