"""vLLM's request fields for structured outputs -> one StructuredOutput: `response_format` (OpenAI's),
`structured_outputs` (vLLM's) and the legacy `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`
(aliases of the latter).

At most one constraint may be asked for, as vLLM rules ("You can only use one kind of structured outputs
constraint"). The HTTP face and the Python clients read the same fields through here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from splice.errors import InvalidArgument
from splice.structured_output import StructuredOutput

FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
# structured_outputs' keys that choose a constraint, and those that tune how it is followed
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# accepted as vLLM's defaults are: no fallback backend exists; xgrammar is the backend. disable_any_whitespace (a
# flag on the constraint, not one) is read by _structured_outputs
_INERT = {"disable_any_whitespace": (True, False), "disable_fallback": (True, False),
          "backend": ("xgrammar", "auto"), "disable_additional_properties": (False,)}


def _json_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, bool)):
        return json.dumps(value)
    raise InvalidArgument(f"{where} must be a JSON schema (an object or its text), got {type(value).__name__}")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{where} must be a nonempty string, got {value!r:.60}")
    return value


def _choice(value: Any, where: str) -> str:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise InvalidArgument(f"{where} must be a nonempty list of nonempty strings, got {value!r:.60}")
    return json.dumps(value)


def _response_format(value: Any) -> StructuredOutput | None:
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"response_format must be an object with a type, got {value!r:.60}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or spec.get("schema") is None:
            raise InvalidArgument("response_format.json_schema.schema must be set to a JSON schema (json_schema: "
                                  "{name, schema, strict})")
        return StructuredOutput("json", _json_text(spec["schema"], "response_format.json_schema.schema"))
    if kind == "structural_tag":  # the whole object, as vLLM passes it on (legacy structures+triggers, or format)
        return StructuredOutput("structural_tag", json.dumps(dict(value)))
    raise InvalidArgument(f"response_format.type must be text, json_object, json_schema or structural_tag, got "
                          f"{kind!r:.60}")


def _structured_outputs(value: Any) -> list[tuple[str, StructuredOutput]]:
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"structured_outputs must be an object, got {value!r:.60}")
    found: list[tuple[str, StructuredOutput]] = []
    for key, item in value.items():
        where = f"structured_outputs.{key}"
        if item is None or (key in _INERT and item in _INERT[key]):
            continue
        if key == "json":
            found.append((where, StructuredOutput("json", _json_text(item, where))))
        elif key in ("regex", "grammar"):
            found.append((where, StructuredOutput(key, _string(item, where))))
        elif key == "choice":
            found.append((where, StructuredOutput("choice", _choice(item, where))))
        elif key == "json_object":
            if item is not False:
                found.append((where, StructuredOutput("json_object")))
        elif key == "structural_tag":
            found.append((where, StructuredOutput("structural_tag", _json_text(item, where))))
        else:
            raise InvalidArgument(f"{where} is not supported (got {item!r:.60}); the constraints are "
                                  f"{', '.join(_KINDS)}")
    if value.get("disable_any_whitespace") is True:  # JSON without whitespace between tokens
        found = [(where, dataclasses.replace(so, disable_any_whitespace=True)) for where, so in found]
    return found


def structured_from_fields(fields: Mapping[str, Any]) -> tuple[str, StructuredOutput] | None:
    """(the field that set it, the one constraint `fields` ask for), None for free text; InvalidArgument naming a
    malformed field, or the fields when more than one constraint is set."""
    found: list[tuple[str, StructuredOutput]] = []
    if fields.get("response_format") is not None:
        so = _response_format(fields["response_format"])
        if so is not None:
            found.append(("response_format", so))
    if fields.get("structured_outputs") is not None:
        found += _structured_outputs(fields["structured_outputs"])
    legacy = {"guided_json": lambda v, w: StructuredOutput("json", _json_text(v, w)),
              "guided_regex": lambda v, w: StructuredOutput("regex", _string(v, w)),
              "guided_choice": lambda v, w: StructuredOutput("choice", _choice(v, w)),
              "guided_grammar": lambda v, w: StructuredOutput("grammar", _string(v, w))}
    for name, make in legacy.items():
        if fields.get(name) is not None:
            found.append((name, make(fields[name], name)))
    if len(found) > 1:
        raise InvalidArgument(f"only one kind of structured output constraint may be set (vLLM's rule), got "
                              f"{', '.join(name for name, _ in found)}")
    return found[0] if found else None
