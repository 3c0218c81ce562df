"""splice/json_depth.py: the depth of JSON text and of parsed values, measured from the shape without recursion,
equal to what a parser would nest; and the refusals naming the part."""

from __future__ import annotations

import json
import random

import pytest

from splice.errors import InvalidArgument
from splice.json_depth import MAX_JSON_DEPTH, TooDeep, check_text, check_value, loads, text_depth, value_depth


def random_json(rng: random.Random, depth: int = 0):
    """A random JSON value: scalars (strings holding brackets, quotes, escapes, non-ASCII), flat arrays of numbers,
    nested arrays and objects (keys holding brackets too), at most 6 levels deep."""
    kind = rng.randrange(7) if depth < 6 else 0
    if kind == 0:
        return rng.choice([0, -17, 3.25, 1e-7, -2e30, None, True, False, "", 'a "[quoted] {text}"', "back\\slash ]",
                           "text, with: [brackets] {}", "\u00e9\u4e2d", "esc \\\" \n \t"])
    if kind < 3:
        return [rng.randrange(-999, 999) for _ in range(rng.randrange(6))]  # (a flat array of numbers)
    if kind < 5:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {f'k{i}[{{"': random_json(rng, depth + 1) for i in range(rng.randrange(5))}


def test_text_and_value_depth_agree_with_the_shape():
    rng = random.Random(3)
    for _ in range(300):
        value = random_json(rng)
        assert text_depth(json.dumps(value)) == value_depth(value)
    assert (text_depth("[]"), text_depth("{}"), text_depth("3"), text_depth('"[[["'), text_depth("")) == (1, 1, 0, 0, 0)
    assert text_depth("[" * 5000 + "]" * 5000) == 5000
    assert text_depth("[" * 5000) == 5000  # unclosed: as deep as a parser would recurse before it fails


def test_values_past_the_cap_are_refused_naming_the_part_and_depth():
    deep = {"a": 1}
    for _ in range(MAX_JSON_DEPTH):
        deep = {"a": deep}
    assert value_depth(deep) == MAX_JSON_DEPTH + 1
    with pytest.raises(InvalidArgument, match=rf"^tools\[2\] nests {MAX_JSON_DEPTH + 1} levels .*at most "
                                              rf"{MAX_JSON_DEPTH}$"):
        check_value(deep, "tools[2]")
    check_value(deep["a"], "tools[2]")
    with pytest.raises(InvalidArgument, match=r"^arguments nests 100000 levels"):
        check_text("[" * 100_000 + "]" * 100_000, "arguments")


def test_loads_reads_deep_text_as_a_parse_failure():
    with pytest.raises(TooDeep) as err:
        loads('{"a": ' + "[" * 1500)
    assert isinstance(err.value, ValueError)
    assert loads('{"a": [[1]]}') == {"a": [[1]]}
