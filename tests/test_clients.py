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
