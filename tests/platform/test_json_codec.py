"""shared.json_codec (orjson) reads and writes the same values as the standard library's json."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import json_codec

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30)


@given(_json_values)
def test_round_trip_matches_the_standard_library(value: object) -> None:
    encoded = json_codec.dumps(value)
    assert json_codec.loads(encoded) == json.loads(json.dumps(value))
    assert json.loads(encoded) == value  # standard JSON, readable by anyone
    assert json_codec.loads(json.dumps(value)) == value


_any_integers = st.recursive(
    st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30)


@given(_any_integers)
def test_reads_what_the_standard_library_writes_integers_past_64_bits_too(value: object) -> None:
    """orjson reads an integer past 64 bits as a float; `loads` reads it exactly, as ``json`` does."""
    back = json_codec.loads(json.dumps(value))
    assert back == value and json.dumps(back) == json.dumps(value)


def test_integers_past_64_bits_are_exact() -> None:
    text = b'{"n": 123456789012345678901234567890, "u": 18446744073709551616, "i": -9223372036854775809}'
    assert json_codec.loads(text) == {"n": 123456789012345678901234567890, "u": 2**64, "i": -(2**63) - 1}
    assert json_codec.loads(text.decode()) == json_codec.loads(memoryview(text)) == json.loads(text)
    assert json_codec.loads(b'{"id": "12345678901234567890", "x": 0.1}') == {"id": "12345678901234567890", "x": 0.1}


def test_floats_come_back_bit_for_bit() -> None:
    values = [0.1, 1e-5, 1e20, 1e16, 5e-324, 1.7976931348623157e308, -0.0, 2.5, 1 / 3]
    back = json_codec.loads(json_codec.dumps(values))
    assert [math.copysign(1, v) for v in back] == [math.copysign(1, v) for v in values]
    assert [v.hex() for v in back] == [v.hex() for v in values]


def test_numpy_values_tuples_and_int_keys() -> None:
    obj = {"a": np.float64(1.5), "b": np.int64(3), "c": np.arange(3), "d": (1, 2), 7: "seven"}
    assert json_codec.loads(json_codec.dumps(obj)) == {"a": 1.5, "b": 3, "c": [0, 1, 2], "d": [1, 2], "7": "seven"}
    assert json_codec.dumps_str({"x": 1}) == '{"x":1}'


def test_unknown_types_are_refused() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        json_codec.dumps({"x": object()})


def test_reads_the_nan_tokens_of_the_standard_library() -> None:
    text = json.dumps({"x": float("nan"), "y": float("inf")})
    back = json_codec.loads(text)
    assert math.isnan(back["x"]) and back["y"] == math.inf
    assert json_codec.loads(memoryview(text.encode()))["y"] == math.inf
    with pytest.raises(json.JSONDecodeError):
        json_codec.loads(b"{not json")
