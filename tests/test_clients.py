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
