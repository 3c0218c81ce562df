"""A structured-output constraint as it travels from the edge to the sampler: what kind of grammar and its text.

vLLM's `response_format`, `structured_outputs` and legacy `guided_*` fields, and the tool-call schemas that
`tool_choice` = `required` or a named function imply, all become one of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]


@dataclass(frozen=True)
class StructuredOutput:
    kind: Kind
    # json: a JSON schema's text; json_object: ""; regex: the pattern; choice: a JSON list of the strings;
    # grammar: EBNF (xgrammar's / GBNF); structural_tag: vLLM's structural-tag JSON.
    spec: str = ""
    # json / json_object: no whitespace between tokens, "," and ":" as separators (vLLM's disable_any_whitespace);
    # False: any whitespace JSON allows, xgrammar's and vLLM's default
    disable_any_whitespace: bool = False
