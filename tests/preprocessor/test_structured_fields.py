"""vLLM's structured-output fields on the HTTP face: each spelling becomes one StructuredOutput, more than one is a
400 naming them, and a malformed or invalid spec is a 400 naming its field before anything else runs."""

from __future__ import annotations

import json

import pytest

from preprocessor.http.convert import chat_sampling, completion_sampling
from preprocessor.http.schemas import ChatCompletionRequest, CompletionRequest
from splice.errors import InvalidArgument
from splice.sampling import MAX_STRUCTURED_SPEC, SamplingParams
from splice.structured_output import StructuredOutput

MESSAGES = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _chat(**fields) -> SamplingParams:
    return chat_sampling(ChatCompletionRequest(messages=MESSAGES, **fields))


@pytest.mark.parametrize(("fields", "want"), [
    ({"response_format": {"type": "json_object"}}, StructuredOutput("json_object")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "strict": True}}},
     StructuredOutput("json", json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredOutput("json", json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, StructuredOutput("json", json.dumps(SCHEMA))),
    ({"structured_outputs": {"regex": "[ab]+"}}, StructuredOutput("regex", "[ab]+")),
    ({"structured_outputs": {"choice": ["a", "b"]}}, StructuredOutput("choice", '["a", "b"]')),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, StructuredOutput("grammar", 'root ::= "a"')),
    ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}},
     StructuredOutput("json_object", disable_any_whitespace=True)),
    ({"structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": False}},
     StructuredOutput("json", '{"type": "object"}')),
    ({"guided_json": SCHEMA}, StructuredOutput("json", json.dumps(SCHEMA))),
    ({"guided_regex": "x+"}, StructuredOutput("regex", "x+")),
    ({"guided_choice": ["yes", "no"]}, StructuredOutput("choice", '["yes", "no"]')),
    ({"guided_grammar": 'root ::= "a"'}, StructuredOutput("grammar", 'root ::= "a"')),
    ({"response_format": {"type": "text"}}, None),
])
def test_each_spelling_becomes_one_structured_output(fields, want):
    assert _chat(**fields).structured == want
    assert completion_sampling(CompletionRequest(prompt="Hi", **fields)).structured == want


def test_the_structured_output_crosses_the_wire():
    p = _chat(guided_choice=["yes", "no"])
    assert SamplingParams.from_pb(p.to_pb()) == p


@pytest.mark.parametrize(("fields", "named"), [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "response_format, guided_regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.regex, structured_outputs.choice"),
    ({"structured_outputs": {"json": SCHEMA}, "guided_json": SCHEMA}, "structured_outputs.json, guided_json"),
])
def test_more_than_one_constraint_is_refused_naming_them(fields, named):
    with pytest.raises(InvalidArgument, match=f"only one kind .* got {named}$"):
        _chat(**fields)


@pytest.mark.parametrize(("fields", "named"), [
    ({"guided_regex": "(ab"}, r"^guided_regex: structured output regex is not valid: .*parenthesis"),
    ({"structured_outputs": {"json": {"type": "bogus"}}}, r"^structured_outputs.json: .*Unsupported type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     r"^response_format: structured output json is not valid"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, r"^structured_outputs.grammar: .*not defined"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, r"response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, r"response_format.type must be"),
    ({"guided_choice": []}, r"guided_choice must be a nonempty list"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, r"structured_outputs.whitespace_pattern is not supported"),
    ({"guided_regex": "a" * (MAX_STRUCTURED_SPEC + 1)}, rf"at most {MAX_STRUCTURED_SPEC}"),
])
def test_bad_specs_are_refused_naming_the_field(fields, named):
    with pytest.raises(InvalidArgument, match=named):
        _chat(**fields)


LEGACY_TAG = {"type": "structural_tag", "structures": [
    {"begin": "<f>", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}, "end": "</f>"}],
    "triggers": ["<f>"]}
FORMAT_TAG = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f>"], "tags": [
    {"begin": "<f>", "content": {"type": "json_schema", "json_schema": {"type": "object"}}, "end": "</f>"}]}}


@pytest.mark.parametrize("tag", [LEGACY_TAG, FORMAT_TAG])
def test_structural_tags_in_vllms_legacy_and_xgrammars_format(tag):
    assert _chat(response_format=tag).structured == StructuredOutput("structural_tag", json.dumps(tag))
    assert _chat(structured_outputs={"structural_tag": json.dumps(tag)}).structured.kind == "structural_tag"
    invalid = r"^response_format: structured output structural_tag is not valid: Invalid structural tag"
    with pytest.raises(InvalidArgument, match=invalid):
        _chat(response_format={"type": "structural_tag", "format": {"type": "nope"}})
    with pytest.raises(InvalidArgument, match="each structure needs begin, schema and end"):
        _chat(response_format={"type": "structural_tag", "structures": [{"begin": "<f>"}], "triggers": []})


async def test_the_servers_disable_any_whitespace_reaches_every_json_grammar(tiny):
    """vLLM's --structured-outputs-config.disable_any_whitespace: the preprocessor's flag makes every request's JSON
    grammar strict (a request may ask for it alone); other grammars are left as they are."""
    import argparse

    from preprocessor import cli
    from preprocessor.core import PreprocessorCore
    from tests.preprocessor.pp_factories import conversation

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    for flags, strict in (([], False), (["--structured-outputs-config", '{"disable_any_whitespace": true}'], True),
                          (["--structured-outputs-config.disable_any_whitespace", "true"], True)):
        assert cli.limits_from_args(parser.parse_args(flags)).disable_any_whitespace is strict
    with pytest.raises(SystemExit):
        parser.parse_args(["--structured-outputs-config", '{"backend": "outlines"}'])

    files, info = tiny["tiny-text"]
    for strict in (False, True):
        core = PreprocessorCore(files, info, limits=cli.limits_from_args(parser.parse_args(
            ["--structured-outputs-config.disable_any_whitespace", str(strict).lower()])))
        for so in (StructuredOutput("json", json.dumps(SCHEMA)), StructuredOutput("json_object"),
                   StructuredOutput("regex", "a+")):
            prepared = await core.prepare_chat(conversation(("user", "Hi")), SamplingParams(structured=so))
            sent = prepared.prompts[0].request.sampling.structured
            assert sent.disable_any_whitespace is (strict and so.kind != "regex")
