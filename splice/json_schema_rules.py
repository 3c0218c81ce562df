"""What a structured output's JSON schema may ask for: only what the grammar will hold.

xgrammar turns a schema into a grammar and passes over what it cannot express with a log line or nothing at all, so
the answer would follow a looser schema than the one sent. Those schemas are refused instead (InvalidArgument naming
the part), as vLLM refuses the features its xgrammar backend lacks (`has_xgrammar_unsupported_json_features`):
- a schema that is not valid against its JSON Schema metaschema (`maxLength: -1`, `type: []`): xgrammar reads such
  values as it can, or not at all;
- a `$ref` outside the schema (`file://`, `http://`): xgrammar logs "URI should ... start with '#/'" and drops the
  constraint, and nothing is ever fetched;
- keywords the grammar does not enforce: `not`, `if`/`then`/`else`, `dependentRequired`, `dependentSchemas`,
  `unevaluatedProperties`, `unevaluatedItems`, `uniqueItems: true`, and an `allOf` of more than one schema;
- an object no output satisfies: `required` names a property that `additionalProperties: false` forbids (the grammar
  would answer `{}`).
Contradictions xgrammar itself detects (minimum > maximum, minLength > maxLength, an empty enum, `false`) are its own
refusals. The walk is iterative and visits subschemas only, never instance data such as a property's name.
"""

from __future__ import annotations

from typing import Any

import jsonschema

# Keywords whose value is one subschema, a list of them, or a map of names to them (JSON Schema 2020-12 and the
# older drafts' spellings).
_ONE = ("items", "additionalItems", "additionalProperties", "contains", "propertyNames", "not", "if", "then", "else",
        "unevaluatedProperties", "unevaluatedItems")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
UNENFORCED = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
              "unevaluatedItems")


def _subschemas(schema: dict[str, Any], path: str) -> list[tuple[Any, str]]:
    out: list[tuple[Any, str]] = []
    for key in _ONE:
        if isinstance(schema.get(key), dict):
            out.append((schema[key], f"{path}.{key}"))
    for key in _MANY:
        if isinstance(schema.get(key), list):
            out += [(s, f"{path}.{key}[{i}]") for i, s in enumerate(schema[key])]
    for key in _NAMED:
        if isinstance(schema.get(key), dict):
            out += [(s, f"{path}.{key}[{name!r}]") for name, s in schema[key].items()]
    return out


def _local(schema: dict[str, Any], path: str) -> str | None:
    for key in UNENFORCED:
        if key in schema:
            return f"{path} uses {key!r}, which the grammar does not enforce"
    if schema.get("uniqueItems") is True:
        return f"{path} uses 'uniqueItems', which the grammar does not enforce"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return f"{path} has an allOf of {len(schema['allOf'])} schemas; the grammar enforces an allOf of one"
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref != "#" and not ref.startswith("#/"):
        return (f"{path}.$ref {ref[:80]!r} points outside the schema; only references inside it ('#/...') are "
                f"followed (nothing is fetched)")
    if schema.get("additionalProperties") is False and isinstance(schema.get("required"), list):
        allowed = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        if not schema.get("patternProperties"):
            missing = [name for name in schema["required"] if name not in allowed]
            if missing:
                return (f"{path} requires {missing[0]!r} but additionalProperties is false and properties has no "
                        f"{missing[0]!r}: no object satisfies it")
    return None


def schema_problem(schema: Any) -> str | None:
    """Why `schema` (parsed JSON, nested within splice/json_depth.py's cap) would not hold as a grammar; None if it
    would (as far as these rules see)."""
    if isinstance(schema, dict):
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            where = "".join(f"[{p!r}]" for p in exc.path)
            return f"the schema is not valid JSON Schema at {where or 'its root'}: {exc.message[:200]}"
    stack = [(schema, "schema")]
    while stack:
        item, path = stack.pop()
        if not isinstance(item, dict):
            continue
        if (problem := _local(item, path)) is not None:
            return problem
        stack += _subschemas(item, path)
    return None
