"""End to end through the generated stubs (via clients/): the real services as processes."""

from __future__ import annotations

import base64
import io

import grpc
import pytest
import torch

from clients import SpliceClient, SpliceClientError
from splice.v1 import preprocessor_pb2 as pp


def _collect(stream):
    chunks = list(stream)
    return chunks, "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids]


def test_mixed_request_streams_and_finishes(stack, mixed_messages):
    _, pre = stack
    with SpliceClient(pre.address, timeout=120) as client:
        tokenized = client.tokenize(mixed_messages)
        info = client.model_info()
        chunks, _, tokens = _collect(client.chat(mixed_messages, temperature=0.0, max_tokens=12, ignore_eos=True))
    # the normalized prompt holds no sentinel and both spans at their lengths
    assert max(tokenized.token_ids) < info.vocab_rows
    assert sorted(length for _, length in tokenized.embed_spans) == [3, 7]
    assert tokenized.image_token_counts and tokenized.image_token_counts[0] > 0
    assert len(chunks) >= 2, "answer arrives as a stream, not one message"
    final = chunks[-1]
    assert final.finish_reason == "length" and final.usage is not None
    assert final.usage.completion_tokens == len(tokens) == 12
    assert final.usage.prompt_tokens == len(tokenized.token_ids)
    assert all(0 <= t < info.vocab_rows for t in tokens)


def test_same_greedy_request_is_reproducible(stack, mixed_messages):
    _, pre = stack
    with SpliceClient(pre.address, timeout=120) as client:
        first = _collect(client.chat(mixed_messages, temperature=0.0, max_tokens=6, ignore_eos=True))[2]
        second = _collect(client.chat(mixed_messages, temperature=0.0, max_tokens=6, ignore_eos=True))[2]
    assert first == second


def test_out_of_range_token_id_in_complete_is_invalid_argument(stack):
    _, pre = stack
    with SpliceClient(pre.address, timeout=60) as client:
        rows = client.model_info().vocab_rows
        with pytest.raises(SpliceClientError) as err:
            list(client.complete([[1, 2, rows + 5]], max_tokens=2))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(rows + 5) in err.value.details and str(rows) in err.value.details


@pytest.mark.parametrize("bad", ["wrong_hidden", "nan", "empty", "int_dtype", "garbage_torch_b64"])
def test_malformed_embeds_rejected_then_next_request_succeeds(stack, bad):
    _, pre = stack
    with SpliceClient(pre.address, timeout=60) as client:
        hidden = client.model_info().hidden_size
        if bad == "garbage_torch_b64":
            part = pp.ContentPart(prompt_embeds=pp.PromptEmbeds(torch_base64=base64.b64encode(b"not a torch file")
                                                                .decode()))
        else:
            tensor = {"wrong_hidden": torch.zeros(2, hidden + 1), "nan": torch.full((2, hidden), float("nan")),
                      "empty": torch.zeros(0, hidden), "int_dtype": torch.zeros(2, hidden, dtype=torch.int64)}[bad]
            part = {"type": "prompt_embeds", "prompt_embeds": tensor}
        with pytest.raises(SpliceClientError) as err:
            list(client.chat([{"role": "user", "content": ["Hi", part]}], max_tokens=2))
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, err.value
        # the service keeps serving
        good = torch.zeros(2, hidden)
        chunks, _, _ = _collect(client.chat([{"role": "user", "content": ["Hi", good]}], temperature=0.0, max_tokens=3))
        assert chunks[-1].finish_reason in ("stop", "length")


def test_vllm_encoded_embeds_accepted(stack, model_dir):
    from app.demo import embedding_rows

    _, pre = stack
    buf = io.BytesIO()
    torch.save(embedding_rows(model_dir, [3, 4]), buf)
    part = pp.ContentPart(prompt_embeds=pp.PromptEmbeds(torch_base64=base64.b64encode(buf.getvalue()).decode()))
    with SpliceClient(pre.address, timeout=60) as client:
        tokenized = client.tokenize([{"role": "user", "content": ["Hi", part]}])
        chunks, _, _ = _collect(client.chat([{"role": "user", "content": ["Hi", part]}], temperature=0.0,
                                            max_tokens=3))
    assert [length for _, length in tokenized.embed_spans] == [2]
    assert chunks[-1].usage.prompt_tokens == len(tokenized.token_ids)
