"""One sentinel per prompt_embeds part, mapped by identity (templates may reorder parts), and sentinel IDs
that are valid engine IDs (padded embedding tables: llava-1.5 32002 tokens / 32064 rows)."""

from __future__ import annotations

import io
import itertools
from dataclasses import replace

import pytest
import torch
from PIL import Image as PILImage
from transformers import AutoProcessor

from preprocessor.content import Conversation, Embeds, Message, Text, TokenIds, Where
from preprocessor.core import PreprocessorCore
from preprocessor.detokenizer import IncrementalDetokenizer
from preprocessor.limits import Limits
from preprocessor.sentinel import FILLER_ID, MAX_EMBEDS_PARTS, SENTINEL_PREFIX, Sentinels
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.errors import SpliceError
from splice.sampling import SamplingParams
from tests.preprocessor.pp_factories import (
    chat_chunks,
    conversation,
    files_for,
    model_info_from_config,
    png_bytes,
    raw,
    rows,
    trusting_core,
)

# Mistral v0.3-style: the system message is not rendered where it stands but inside the LAST user turn.
REORDERING = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
)


def _reject(fn, code="INVALID_ARGUMENT") -> str:
    with pytest.raises(SpliceError) as exc:
        fn()
    assert exc.value.code == code, exc.value.message
    return exc.value.message


def test_reordering_template_keeps_each_tensor_with_its_part(tiny):
    files, info = tiny["tiny-text"]
    tok = files.tokenizer
    hidden = info.hidden_size
    sys_rows, first_rows, last_rows = rows(2, hidden, seed=1), rows(3, hidden, seed=2), rows(4, hidden, seed=3)
    # Conversation order of the embeds parts: system (tensor 0), first user (1), last user (2).
    around = {0: ("System says ", " to everyone"), 1: ("First asks ", " kindly"), 2: ("Last asks ", " finally")}
    tensors = {0: sys_rows, 1: first_rows, 2: last_rows}
    conv = conversation(("system", [around[0][0], sys_rows, around[0][1]]),
                        ("user", [around[1][0], first_rows, around[1][1]]),
                        ("assistant", "Sure."),
                        ("user", [around[2][0], last_rows, around[2][1]]),
                        chat_template=REORDERING)
    norm = trusting_core(files, info).normalize_chat(conv)
    req = norm.request

    # The template moved the system part after the first user part: prompt order is parts 1, 0, 2.
    prompt = norm.prompt
    assert prompt.index(Sentinels.text(1)) < prompt.index(Sentinels.text(0)) < prompt.index(Sentinels.text(2))
    assert [s.tensor_index for s in req.embed_spans] == [1, 0, 2]
    assert [s.offset for s in req.embed_spans] == sorted(s.offset for s in req.embed_spans)

    # Expected offsets, independently: the prompt's pieces between sentinels, each tokenized on its own
    # (added tokens split the text the same way), plus the rows of each part in between.
    pieces, order, rest = [], [], prompt
    while SENTINEL_PREFIX in rest:
        head, _, tail = rest.partition(SENTINEL_PREFIX)
        k, _, rest = tail.partition("|>")
        pieces.append(head)
        order.append(int(k.lstrip("_")))
    assert order == [1, 0, 2]
    offsets, pos = [], 0
    for head, k in zip(pieces, order, strict=True):
        pos += len(tok(head, add_special_tokens=False)["input_ids"])
        offsets.append(pos)
        pos += tensors[k].shape[0]
    assert [s.offset for s in req.embed_spans] == offsets

    # Each span's rows are the tensor of the part whose text surrounds it, and its positions hold the filler.
    for span in req.embed_spans:
        before, after = around[span.tensor_index]
        assert tok.decode(req.token_ids[:span.offset]).endswith(before)
        assert tok.decode(req.token_ids[span.offset + span.length:]).startswith(after)
        assert span.length == tensors[span.tensor_index].shape[0]
        assert torch.equal(req.span_rows(span), tensors[span.tensor_index])
        assert req.token_ids[span.offset:span.offset + span.length] == [FILLER_ID] * span.length
    assert not files.sentinels.id_set & set(req.token_ids)


def test_part_rendered_twice_or_never_names_the_part(tiny):
    files, info = tiny["tiny-text"]
    core = trusting_core(files, info)
    twice = "{{ messages[0]['content'] }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    conv = conversation(("user", ["a", rows(2, info.hidden_size)]), ("assistant", "b"), chat_template=twice)
    assert "rendered prompt_embeds part (message 0, part 1) 2 times" in _reject(lambda: core.normalize_chat(conv))
    skips_last = "{% for m in messages[:-1] %}{{ m['content'] }}{% endfor %}"
    conv = conversation(("user", ["a", rows(2, info.hidden_size)]), ("user", ["b", rows(1, info.hidden_size)]),
                        chat_template=skips_last)
    assert "rendered prompt_embeds part (message 1, part 1) 0 times" in _reject(lambda: core.normalize_chat(conv))


def test_adjacent_parts_and_many_parts(tiny):
    files, info = tiny["tiny-text"]
    parts = [rows(k % 3 + 1, info.hidden_size, seed=k) for k in range(Limits().max_embeds_parts)]
    req = PreprocessorCore(files, info).normalize_chat(conversation(("user", ["x", *parts, "y"]))).request
    assert [s.tensor_index for s in req.embed_spans] == list(range(len(parts)))
    for s, p in zip(req.embed_spans, parts, strict=True):
        assert torch.equal(req.span_rows(s), p)
    assert all(b.offset == a.offset + a.length for a, b in itertools.pairwise(req.embed_spans))
    assert len(files.sentinels.ids) == MAX_EMBEDS_PARTS
    with pytest.raises(ValueError, match="max_embeds_parts"):
        Limits(max_embeds_parts=MAX_EMBEDS_PARTS + 1)


def test_sentinel_strings_forbidden_in_roles_kwargs_and_template(tiny):
    files, info = tiny["tiny-text"]
    core = trusting_core(files, info)
    role = Conversation((Message("user", (Text("hi", Where(0, 0)),), True, 0),
                         Message(f"user{Sentinels.text(0)}", (Text("x", Where(1, 0)),), True, 1)))
    msg = _reject(lambda: core.normalize_chat(role))
    assert "messages[1].role" in msg and SENTINEL_PREFIX in msg
    nested = conversation(("user", "x"), template_kwargs={"tools": [{"name": f"t {Sentinels.text(7)}"}]})
    assert "chat_template_kwargs['tools'][0]['name']" in _reject(lambda: core.normalize_chat(nested))
    a_key = conversation(("user", "x"), template_kwargs={"docs": {Sentinels.text(1): "v"}})
    assert "chat_template_kwargs['docs']" in _reject(lambda: core.normalize_chat(a_key))
    override = conversation(("user", "x"), chat_template="{{ '" + Sentinels.text(0) + "' }}")
    assert "chat_template contains" in _reject(lambda: core.normalize_chat(override))
    built = conversation(("user", "x"), chat_template="{{ '<|splice_prompt_' ~ 'embeds_5|>' }}")
    assert "only 0 prompt_embeds parts" in _reject(lambda: core.normalize_chat(built))  # a stray sentinel
    llava_files, llava_info = tiny["tiny-llava"]
    image_role = conversation(("<image>", "x"))
    assert "messages[0].role" in _reject(lambda: PreprocessorCore(llava_files, llava_info).normalize_chat(image_role))


# --- sentinel IDs that are valid engine IDs (headroom) ---


def _headroom(tiny):
    files, info = tiny["tiny-text"]
    assert info.vocab_rows == files.base_vocab  # the tiny model has no headroom...
    roomy = replace(info, vocab_rows=files.base_vocab + 64)  # ...so give it llava's
    assert files.sentinels.ids[0] < roomy.vocab_rows <= files.sentinels.ids[-1]
    return files, roomy


def test_complete_takes_an_id_equal_to_a_sentinel_id_as_an_ordinary_id(tiny):
    files, info = _headroom(tiny)
    sid0, sid1 = files.sentinels.ids[:2]
    x = rows(3, info.hidden_size)
    text_ids = files.tokenizer(" tail", add_special_tokens=False)["input_ids"]
    req = PreprocessorCore(files, info).normalize_complete([
        TokenIds((5, sid0), Where(None, 0)), Embeds("tensor", raw(x), Where(None, 1)),
        TokenIds((sid1,), Where(None, 2)), Text(" tail", Where(None, 3))]).request
    assert req.token_ids == [5, sid0, FILLER_ID, FILLER_ID, FILLER_ID, sid1, *text_ids]
    assert [(s.offset, s.length, s.tensor_index) for s in req.embed_spans] == [(2, 3, 0)]
    assert torch.equal(req.span_rows(req.embed_spans[0]), x)


def test_chat_with_headroom_sentinels_still_consumed(tiny):
    files, info = _headroom(tiny)
    a, b = rows(2, info.hidden_size, seed=1), rows(3, info.hidden_size, seed=2)
    norm = PreprocessorCore(files, info).normalize_chat(conversation(("user", ["p ", a, " q ", b, " r"])))
    req = norm.request
    assert [(s.length, s.tensor_index) for s in req.embed_spans] == [(2, 0), (3, 1)]
    assert [norm.raw_ids[s.offset] for s in req.embed_spans] == list(files.sentinels.ids[:2])
    assert not files.sentinels.id_set & set(req.token_ids)


@pytest.mark.parametrize("skip", [True, False])
def test_detokenize_drops_sentinel_ids(tiny, skip):
    files, info = _headroom(tiny)
    core = PreprocessorCore(files, info)
    hello = files.tokenizer("Hello world", add_special_tokens=False)["input_ids"]
    sids = [s for s in files.sentinels.ids if s < info.vocab_rows][:3]
    mixed = [hello[0], sids[0], *hello[1:], sids[1], sids[2]]
    text = core.detokenize(mixed, skip_special_tokens=skip)
    assert SENTINEL_PREFIX not in text and text == core.detokenize(hello, skip_special_tokens=skip)
    detok = IncrementalDetokenizer(files.tokenizer, skip, files.sentinels.id_set)
    streamed = "".join(detok.push(t) for t in mixed) + detok.flush()
    assert streamed == text


class _Replay:
    def __init__(self, ids):
        self.ids = ids

    async def generate(self, request):
        yield EngineOutput(tuple(self.ids), finish_reason=FinishReason.LENGTH,
                           usage=Usage(request.prompt_len, len(self.ids)))


async def test_stream_never_emits_sentinel_text(tiny):
    files, info = _headroom(tiny)
    hello = files.tokenizer("Hi there", add_special_tokens=False)["input_ids"]
    generated = [files.sentinels.ids[0], *hello, files.sentinels.ids[1]]
    core = PreprocessorCore(files, info, _Replay(generated))
    chunks = await chat_chunks(core, conversation(("user", "x")), SamplingParams(skip_special_tokens=False))
    assert "".join(c.text for c in chunks) == "Hi there"
    assert [t for c in chunks for t in c.token_ids] == generated  # the IDs themselves are still reported


# --- llava-1.5's real files: 32002 tokens, 32064 embedding rows ---

LLAVA = "llava-hf__llava-1.5-7b-hf"


@pytest.mark.fidelity
def test_llava_15_sentinels_inside_the_table_yet_spans_correct(shared_models):
    path = shared_models / LLAVA
    files, info = files_for(path), model_info_from_config(path)
    assert (files.base_vocab, info.vocab_rows) == (32002, 32064)
    assert files.sentinels.ids[0] == 32002 and files.sentinels.ids[61] == 32063  # valid engine IDs
    a, b = rows(3, info.hidden_size, seed=1), rows(5, info.hidden_size, seed=2)  # [3, 4096], [5, 4096]
    image = png_bytes(70, 45)
    turns = [("user", [image, "Compare ", a, " with ", b, " please."])]
    core = PreprocessorCore(files, info)
    norm = core.normalize_chat(conversation(*turns))
    req = norm.request
    assert [(s.length, s.tensor_index) for s in req.embed_spans] == [(3, 0), (5, 1)]
    assert torch.equal(req.span_rows(req.embed_spans[0]), a) and torch.equal(req.span_rows(req.embed_spans[1]), b)
    assert [norm.raw_ids[s.offset] for s in req.embed_spans] == list(files.sentinels.ids[:2])
    assert not files.sentinels.id_set & set(req.token_ids)
    span_positions = {p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)}
    assert all(req.token_ids[p] == FILLER_ID for p in span_positions)
    # Text around the spans where it belongs; up to the last image token the IDs are HF's own (llava's
    # template pads each text part with a space, so SentencePiece splits the rest differently without the parts).
    tok = files.tokenizer
    s0, s1 = req.embed_spans
    assert tok.decode(req.token_ids[:s0.offset]).rstrip().endswith("Compare")
    assert tok.decode(req.token_ids[s0.offset + s0.length:s1.offset]).strip() == "with"
    assert tok.decode(req.token_ids[s1.offset + s1.length:]).strip().startswith("please.")
    proc = AutoProcessor.from_pretrained(path, backend="pil")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Compare with please."}]}]
    pic = PILImage.open(io.BytesIO(image)).convert("RGB")
    hf = proc(text=proc.apply_chat_template(messages, add_generation_prompt=True), images=[pic],
              return_tensors="pt")["input_ids"][0].tolist()
    last_image = max(i for i, t in enumerate(hf) if t == info.image_token_id)
    assert req.token_ids[:last_image + 1] == hf[:last_image + 1] and last_image < s0.offset

    # Complete: an ordinary ID equal to a sentinel ID passes through; Detokenize never shows a sentinel.
    sid = files.sentinels.ids[0]
    got = core.normalize_complete([TokenIds((1, sid, 2), Where(None, 0)), Embeds("tensor", raw(a), Where(None, 1))])
    assert got.request.token_ids == [1, sid, 2, FILLER_ID, FILLER_ID, FILLER_ID]
    assert [(s.offset, s.length) for s in got.request.embed_spans] == [(3, 3)]
    assert SENTINEL_PREFIX not in core.detokenize([1, sid, 2], skip_special_tokens=False)


# --- Sentinels.splice on its own: expansion and consumption are one call ---


def test_splice_expands_locates_then_consumes():
    s = Sentinels((900, 901, 902))  # as registered on some tokenizer; only their identity matters here
    wheres = [Where(0, 1), Where(0, 3)]
    got = s.splice([7, 901, 900, 8], [2, 3], wheres)  # the template put part 1 before part 0, touching
    assert got.expanded == [7, 901, 901, 901, 900, 900, 8]
    assert [(sp.offset, sp.length, sp.part) for sp in got.spans] == [(1, 3, 1), (4, 2, 0)]
    assert got.ids == [7] + [FILLER_ID] * 5 + [8]
    with pytest.raises(SpliceError, match=r"part \(message 0, part 3\) 0 times"):
        s.splice([7, 900, 8], [2, 3], wheres)
    with pytest.raises(SpliceError, match="only 2 prompt_embeds parts"):
        s.splice([900, 901, 902], [1, 1], wheres)
    assert s.drop([1, 900, 2, 902]) == [1, 2] and s.count == 3


def test_sentinel_check_text_names_the_place():
    s = Sentinels((900,))
    s.check_text("plain", Where(0, 0))
    with pytest.raises(SpliceError, match=r"^messages\[2\]\.role: role contains the reserved string"):
        s.check_text(f"x{Sentinels.text(5)}", "messages[2].role", "role")
