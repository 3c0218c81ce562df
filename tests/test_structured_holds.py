"""Issue 40 row 13: a structured output that would not hold is refused, naming the part, instead of served with the
constraint silently dropped (xgrammar logs or ignores what it cannot express): a $ref outside the schema, a schema
invalid against its metaschema (maxLength -1), keywords the grammar does not enforce, an object no output satisfies
(it answered {}); and a grammar beside a token mask or floor (allowed_token_ids, bad_words, min_tokens), which the
docs state and the sampling rules enforce one way: refused."""

from __future__ import annotations

import json

import pytest

from splice.errors import InvalidArgument
from splice.grammar import check
from splice.json_depth import MAX_SPEC_DEPTH
from splice.sampling import SamplingParams
from splice.structured_output import StructuredOutput


def _json(schema) -> StructuredOutput:
    return StructuredOutput("json", json.dumps(schema))


@pytest.mark.parametrize("schema, named", [
    ({"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}, "required": ["a"]},
     r"schema\.properties\['a'\]\.\$ref 'file:///etc/passwd' points outside the schema"),
    ({"$ref": "http://example.com/s.json"}, r"schema\.\$ref 'http://example\.com/s\.json' points outside"),
    ({"type": "string", "maxLength": -1}, r"not valid JSON Schema at \['maxLength'\]: -1 is less than the minimum"),
    ({"type": []}, r"not valid JSON Schema at \['type'\]"),
    ({"type": "object", "properties": {}, "required": ["a"], "additionalProperties": False},
     r"schema requires 'a' but additionalProperties is false .*no object satisfies it"),
    ({"not": {"type": "integer"}}, r"schema uses 'not', which the grammar does not enforce"),
    ({"type": "object", "properties": {"x": {"if": {"type": "integer"}, "then": {"minimum": 5}}}},
     r"schema\.properties\['x'\] uses 'if'"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, r"uses 'uniqueItems'"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, r"has an allOf of 2 schemas"),
    ({"$defs": {"d": {"dependentRequired": {"a": ["b"]}}}, "$ref": "#/$defs/d"},
     r"schema\.\$defs\['d'\] uses 'dependentRequired'"),
])
def test_schemas_that_would_not_hold_are_refused_naming_the_part(schema, named):
    with pytest.raises(InvalidArgument, match=rf"^guided_json: structured output json: .*{named}"):
        check(_json(schema), "guided_json")


def test_schemas_that_hold_pass():
    for schema in ({"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"}},
                    "required": ["not"], "additionalProperties": False},  # (property names, not keywords)
                   {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "integer"}}},
                   {"allOf": [{"type": "string"}]}, {"type": "array", "uniqueItems": False}, True, {}):
        check(_json(schema), "guided_json")


def test_a_structural_tag_schema_is_held_to_the_same_rules():
    tag = {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": {"not": {}}, "end": "</f>"}],
           "triggers": ["<f>"]}
    with pytest.raises(InvalidArgument, match=r"structures\[0\]: schema uses 'not'"):
        check(StructuredOutput("structural_tag", json.dumps(tag)), "response_format")


def test_a_spec_nested_past_the_cap_is_refused_from_its_shape():
    deep = '{"items":' * 1000 + "{}" + "}" * 1000  # issue 40 row 6: checked on the event loop for 34 s before
    with pytest.raises(InvalidArgument, match=rf"^guided_json: structured output json nests 1001 levels .*at most "
                                              rf"{MAX_SPEC_DEPTH}$"):
        check(StructuredOutput("json", deep), "guided_json")
    with pytest.raises(InvalidArgument, match=r"structured output choice nests 5000 levels"):
        check(StructuredOutput("choice", "[" * 5000 + "]" * 5000), "guided_choice")


@pytest.mark.parametrize("field, value", [("allowed_token_ids", (1, 2)), ("bad_words", ("no",)), ("min_tokens", 3)])
def test_a_grammar_beside_a_token_mask_or_floor_is_refused(field, value):
    so = StructuredOutput("regex", "[a-z]+")
    with pytest.raises(InvalidArgument, match=rf"^sampling\.{field} cannot be kept beside a structured output"):
        SamplingParams(structured=so, max_tokens=8, **{field: value})
    SamplingParams(max_tokens=8, **{field: value})  # each alone is served
    SamplingParams(structured=so, max_tokens=8, logit_bias={5: 2.0})  # a bias shifts, it does not mask
