"""bucket_id: the shared Picodata and vshard vectors, and property tests against Python models.

The reference models below are written from the scheme descriptions (MessagePack via the
``msgpack`` package, MurmurHash3 via ``mmh3``, CRC-32C by its definition), independently of the
Rust implementation.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
import uuid
from decimal import Decimal
from typing import Any

import mmh3
import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shardline._core import bucket_id
from shardline.errors import UnhashableKey
from support.vectors import PICODATA, VSHARD, key_part

# --------------------------------------------------------------------------------------------
# Shared vectors


# PICODATA and VSHARD: support/vectors.py (copied verbatim from shared/data)


# --------------------------------------------------------------------------------------------
# Reference models

INT_MIN, UINT_MAX = -(2**63), 2**64 - 1
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def pack(obj: Any) -> bytes:
    """msgpack.packb, typed."""
    return bytes(msgpack.packb(obj))


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes, crc: int = 0xFFFFFFFF) -> int:
    """Tarantool's digest.crc32: CRC-32C, init 0xFFFFFFFF, no final xor."""
    for byte in data:
        crc = (crc >> 8) ^ _CRC_TABLE[(crc ^ byte) & 0xFF]
    return crc


def ref_decimal(value: Decimal, decimal_format: str) -> bytes:
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    digit_list = list(digits)
    if decimal_format == "binary" and exponent > 0:
        digit_list += [0] * exponent
        exponent = 0
        while len(digit_list) > 1 and digit_list[0] == 0:
            digit_list.pop(0)
    scale = -exponent
    assert len(digit_list) <= 28
    assert abs(scale) <= 28
    nibbles = [*digit_list, 0xD if sign else 0xC]
    if len(nibbles) % 2:
        nibbles.insert(0, 0)
    bcd = bytes(hi << 4 | lo for hi, lo in zip(nibbles[::2], nibbles[1::2], strict=True))
    return pack(msgpack.ExtType(1, pack(scale) + bcd))


def ref_datetime(value: dt.datetime) -> bytes:
    delta = value - EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    seconds, sub = divmod(micros, 1_000_000)
    data = struct.pack("<q", seconds)
    if sub:
        data += struct.pack("<ihh", sub * 1000, 0, 0)
    return pack(msgpack.ExtType(4, data))


def ref_picodata_part(value: Any, decimal_format: str = "binary") -> bytes:
    if isinstance(value, str):
        return value.encode()
    if value is None or isinstance(value, bool):
        return pack(value)
    if isinstance(value, int):
        assert INT_MIN <= value <= UINT_MAX
        return pack(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and INT_MIN <= value <= UINT_MAX:
            return pack(int(value))
        return struct.pack(">d", value)
    if isinstance(value, Decimal):
        return ref_decimal(value, decimal_format)
    if isinstance(value, dt.datetime):
        return ref_datetime(value)
    if isinstance(value, uuid.UUID):
        return pack(msgpack.ExtType(2, value.bytes))
    raise AssertionError(f"no reference encoding for {value!r}")


def ref_mpcrc32_part(value: Any, decimal_format: str = "binary") -> bytes:
    """msgpackffi.encode of the Lua value a vshard router decodes the part into."""
    if isinstance(value, float):
        # A double becomes a Lua number; msgpackffi writes an integral one as an integer.
        if value.is_integer() and INT_MIN <= value <= UINT_MAX:
            return pack(int(value))
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, dt.datetime):
        raise AssertionError("mpcrc32 has no datetime encoding")
    return ref_picodata_part(value, decimal_format)


def ref_strcrc32_part(value: Any) -> bytes:
    """Lua tostring() of the value a vshard router decodes the part into."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int):
        if abs(value) <= 10**14 - 1:
            return str(value).encode()
        return f"{value}{'ULL' if value > 0 else 'LL'}".encode()
    if isinstance(value, float):
        return (f"{value:.14g}").encode()
    if isinstance(value, uuid.UUID):
        return str(value).encode()
    raise AssertionError(f"no reference rendering for {value!r}")


def _parts(key: Any) -> tuple[Any, ...]:
    return key if isinstance(key, tuple) else (key,)


def ref_bucket(key: Any, bucket_count: int, scheme: str, decimal_format: str = "binary") -> int:
    parts = _parts(key)
    if scheme == "picodata":
        data = b"".join(ref_picodata_part(p, decimal_format) for p in parts)
        return mmh3.hash(data, 13, signed=False) % bucket_count + 1
    if scheme == "vshard-mpcrc32":
        data = b"".join(ref_mpcrc32_part(p, decimal_format) for p in parts)
    else:
        data = b"".join(ref_strcrc32_part(p) for p in parts)
    return crc32c(data) % bucket_count + 1


# --------------------------------------------------------------------------------------------
# Vectors


@pytest.mark.parametrize("index", range(len(PICODATA)))
def test_picodata_vector(index: int) -> None:
    vector = PICODATA[index]
    key = tuple(key_part(part) for part in vector["key"])
    assert bucket_id(key, vector["bucket_count"]) == vector["bucket_id"]
    # The reference model agrees too, so the property tests below compare against a validated model.
    assert ref_bucket(key, vector["bucket_count"], "picodata") == vector["bucket_id"]
    if len(key) == 1:
        assert bucket_id(key[0], vector["bucket_count"]) == vector["bucket_id"]


@pytest.mark.parametrize("index", range(len(VSHARD)))
def test_vshard_vector(index: int) -> None:
    vector = VSHARD[index]
    scheme, count, want = vector["scheme"], vector["bucket_count"], vector["bucket_id"]
    if "key_bytes_utf8" in vector:
        # tostring() output; "1LL"/"1ULL" are how Lua prints int64/uint64 cdata.
        text = vector["key_bytes_utf8"]
        assert crc32c(text.encode()) % count + 1 == want
        assert bucket_id(text, count, scheme=scheme) == want
        if text.isdigit():
            assert bucket_id(int(text), count, scheme=scheme) == want
        return
    kind = vector["key"]["type"]
    hashed = bytes.fromhex(vector.get("msgpack_hex") or vector["hashed_hex"])
    assert crc32c(hashed) % count + 1 == want
    if kind in ("float64", "float32"):
        # FFI cdata double/float: no Python value decodes to these on a router (a msgpack float
        # decodes to a Lua number). A fractional float still carries the 0xcb byte, as here.
        assert hashed[0] == (0xCB if kind == "float64" else 0xCA)
        frac = 1.5
        assert (
            bucket_id(frac, count, scheme=scheme)
            == crc32c(b"\xcb" + struct.pack(">d", frac)) % count + 1
        )
        # A whole float is a whole Lua number, which msgpackffi writes as an integer.
        whole = float(vector["key"]["value"])
        assert bucket_id(whole, count, scheme=scheme) == bucket_id(int(whole), count, scheme=scheme)
        return
    value = key_part(vector["key"])
    assert ref_mpcrc32_part(value) == hashed
    assert bucket_id(value, count, scheme=scheme) == want
    assert bucket_id((value,), count, scheme=scheme) == want


# --------------------------------------------------------------------------------------------
# Property tests against the reference models

ints = st.integers(INT_MIN, UINT_MAX)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(INT_MIN, 2**64).map(float),
    st.sampled_from([-0.0, 0.5, -(2.0**63), 2.0**64, 1e300, -1e-300]),
)
uuids = st.uuids()


def _decimal(sign: int, digits: list[int], exponent: int) -> Decimal:
    return Decimal((sign, tuple(digits), exponent))


def fits_binary(value: Decimal) -> bool:
    """At most 28 digits once a positive exponent is expanded (Decimal("0E+5") is just 0)."""
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    return digits == (0,) or len(digits) + max(exponent, 0) <= 28


decimals = st.builds(
    _decimal,
    st.integers(0, 1),
    st.lists(st.integers(0, 9), min_size=1, max_size=28),
    st.integers(-28, 28),
)
binary_decimals = decimals.filter(fits_binary)


def vshard_whole_float_is_undefined(value: Any) -> bool:
    """A whole float in (-1e63, 1e64) but outside [-2**63, 2**64): LuaJIT's int conversion is UB."""
    return (
        isinstance(value, float)
        and value.is_integer()
        and -1e63 < value < 1e64
        and not INT_MIN <= value <= UINT_MAX
    )


offsets = st.timedeltas(
    min_value=dt.timedelta(hours=-23, minutes=-59), max_value=dt.timedelta(hours=23, minutes=59)
)
datetimes = st.datetimes(timezones=st.builds(dt.timezone, offsets))
scalars = st.one_of(st.text(), ints, st.booleans(), st.none(), floats, uuids)
bucket_counts = st.integers(1, 2**32 - 1)


@given(st.text(), bucket_counts)
def test_str_matches_reference(key: str, count: int) -> None:
    assert bucket_id(key, count) == ref_bucket(key, count, "picodata")


@given(ints, bucket_counts)
def test_int_matches_reference(key: int, count: int) -> None:
    assert bucket_id(key, count) == ref_bucket(key, count, "picodata")


@given(floats, bucket_counts)
def test_float_matches_reference(key: float, count: int) -> None:
    assert bucket_id(key, count) == ref_bucket(key, count, "picodata")


@given(st.one_of(st.booleans(), st.none(), uuids), bucket_counts)
def test_bool_none_uuid_match_reference(key: Any, count: int) -> None:
    assert bucket_id(key, count) == ref_bucket(key, count, "picodata")


@given(decimals, st.sampled_from(["binary", "text"]), bucket_counts)
def test_decimal_matches_reference(key: Decimal, decimal_format: str, count: int) -> None:
    assume(decimal_format == "text" or fits_binary(key))
    got = bucket_id(key, count, decimal_format=decimal_format)
    assert got == ref_bucket(key, count, "picodata", decimal_format)


@given(datetimes, bucket_counts)
def test_datetime_matches_reference(key: dt.datetime, count: int) -> None:
    assert bucket_id(key, count) == ref_bucket(key, count, "picodata")


@given(
    st.lists(st.one_of(scalars, binary_decimals, datetimes), min_size=1, max_size=6), bucket_counts
)
def test_tuple_matches_reference(parts: list[Any], count: int) -> None:
    key = tuple(parts)
    assert bucket_id(key, count) == ref_bucket(key, count, "picodata")


@given(scalars, bucket_counts, st.sampled_from(["picodata", "vshard-mpcrc32"]))
def test_single_value_equals_one_tuple(value: Any, count: int, scheme: str) -> None:
    # vshard rejects a nil key (but not a nil part).
    assume(not (value is None and scheme != "picodata"))
    assume(not (scheme != "picodata" and vshard_whole_float_is_undefined(value)))
    assert bucket_id(value, count, scheme=scheme) == bucket_id((value,), count, scheme=scheme)


@given(st.lists(st.one_of(scalars, binary_decimals), min_size=1, max_size=6), bucket_counts)
def test_mpcrc32_matches_reference(parts: list[Any], count: int) -> None:
    assume(not any(vshard_whole_float_is_undefined(p) for p in parts))
    key = tuple(parts)
    assert bucket_id(key, count, scheme="vshard-mpcrc32") == ref_bucket(
        key, count, "vshard-mpcrc32"
    )


strcrc32_parts = st.one_of(
    st.text(), ints, st.booleans(), st.floats(allow_nan=False, allow_infinity=False), uuids
)


@given(st.lists(strcrc32_parts, min_size=1, max_size=6), bucket_counts)
def test_strcrc32_matches_reference(parts: list[Any], count: int) -> None:
    key = tuple(parts)
    assert bucket_id(key, count, scheme="vshard-strcrc32") == ref_bucket(
        key, count, "vshard-strcrc32"
    )


@given(st.one_of(st.text(), ints), bucket_counts)
def test_bucket_in_range(key: Any, count: int) -> None:
    for scheme in ("picodata", "vshard-mpcrc32", "vshard-strcrc32"):
        assert 1 <= bucket_id(key, count, scheme=scheme) <= count


# --------------------------------------------------------------------------------------------
# Specific encodings


def test_decimal_binary_expands_exponent_text_keeps_it() -> None:
    key, count = Decimal("1E+3"), 2**32 - 1
    binary = bucket_id(key, count)
    assert binary == bucket_id(key, count, decimal_format="binary")
    assert binary == bucket_id(Decimal("1000"), count)
    # digits 1000, scale 0 / digit 1, scale -3
    assert ref_decimal(key, "binary") == bytes.fromhex("d6010001000c")
    assert ref_decimal(key, "text") == bytes.fromhex("d501fd1c")
    assert binary == mmh3.hash(bytes.fromhex("d6010001000c"), 13, signed=False) % count + 1
    text = bucket_id(key, count, decimal_format="text")
    assert text == mmh3.hash(bytes.fromhex("d501fd1c"), 13, signed=False) % count + 1
    assert text != binary


def test_decimal_keeps_trailing_zeros() -> None:
    assert bucket_id(Decimal("1.10"), 2**32 - 1) != bucket_id(Decimal("1.1"), 2**32 - 1)


def test_decimal_zero_with_positive_exponent() -> None:
    assert bucket_id(Decimal("0E+5"), 2**32 - 1) == bucket_id(Decimal("0"), 2**32 - 1)


def test_whole_float_hashes_as_int() -> None:
    for value in (0, 1, -1, 2**63, -(2**63), 2**53):
        assert bucket_id(float(value), 2**32 - 1) == bucket_id(value, 2**32 - 1)
    assert bucket_id(-0.0, 2**32 - 1) == bucket_id(0, 2**32 - 1)


def test_aware_datetime_offset_is_normalised_to_utc() -> None:
    utc = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    plus3 = utc.astimezone(dt.timezone(dt.timedelta(hours=3)))
    assert bucket_id(utc, 2**32 - 1) == bucket_id(plus3, 2**32 - 1)


def test_subclasses_hash_like_their_base() -> None:
    import enum

    class Color(enum.IntEnum):
        RED = 7

    class Name(str):
        pass

    assert bucket_id(Color.RED, 30000) == bucket_id(7, 30000)
    assert bucket_id(Name("abc"), 30000) == bucket_id("abc", 30000)


def test_numpy_scalars_hash_like_python_numbers() -> None:
    np = pytest.importorskip("numpy")
    for scheme in ("picodata", "vshard-mpcrc32", "vshard-strcrc32"):
        assert bucket_id(np.int64(-7), 30000, scheme=scheme) == bucket_id(-7, 30000, scheme=scheme)
        assert bucket_id(np.uint64(UINT_MAX), 30000, scheme=scheme) == bucket_id(
            UINT_MAX, 30000, scheme=scheme
        )
        assert bucket_id(np.int32(5), 30000, scheme=scheme) == bucket_id(5, 30000, scheme=scheme)
        assert bucket_id(np.float64(1.5), 30000, scheme=scheme) == bucket_id(
            1.5, 30000, scheme=scheme
        )


def test_strcrc32_renders_like_lua() -> None:
    count = 3000
    assert bucket_id(1, count, scheme="vshard-strcrc32") == 477
    assert bucket_id(1.0, count, scheme="vshard-strcrc32") == 477
    big = 10**14
    assert bucket_id(big, count, scheme="vshard-strcrc32") == bucket_id(
        f"{big}ULL", count, scheme="vshard-strcrc32"
    )
    assert bucket_id(-big, count, scheme="vshard-strcrc32") == bucket_id(
        f"{-big}LL", count, scheme="vshard-strcrc32"
    )
    assert bucket_id((True, "a"), count, scheme="vshard-strcrc32") == bucket_id(
        "truea", count, scheme="vshard-strcrc32"
    )


def test_vshard_composite_is_the_crc_of_the_concatenation() -> None:
    count = 2**32 - 1
    assert bucket_id(("ab", "cd"), count, scheme="vshard-mpcrc32") == bucket_id(
        "abcd", count, scheme="vshard-mpcrc32"
    )


def test_vshard_nil_part_is_msgpack_nil() -> None:
    count = 2**32 - 1
    want = crc32c(b"\x01\xc0") % count + 1
    assert bucket_id((1, None), count, scheme="vshard-mpcrc32") == want


# --------------------------------------------------------------------------------------------
# Unhashable keys


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


UNHASHABLE: list[tuple[Any, list[str]]] = [
    (dt.datetime(2024, 1, 1), ["'datetime'", "naive", "2024"]),
    (Decimal("NaN"), ["'Decimal'", "Decimal('NaN')", "non-finite"]),
    (Decimal("sNaN"), ["'Decimal'", "non-finite"]),
    (Decimal("-Infinity"), ["'Decimal'", "non-finite"]),
    (Decimal("1" * 29), ["'Decimal'", "1" * 29, "28"]),
    (Decimal("1E-29"), ["'Decimal'", "1E-29"]),
    (Decimal("1E+28"), ["'Decimal'", "1E+28"]),  # 29 digits once expanded (binary)
    (2**64, ["'int'", str(2**64), "range"]),
    (-(2**63) - 1, ["'int'", str(-(2**63) - 1), "range"]),
    ([1, 2], ["'list'", "[1, 2]", "tuple"]),
    (b"ab", ["'bytes'", "b'ab'"]),
    (bytearray(b"x"), ["'bytearray'"]),
    ({"a": 1}, ["'dict'", "{'a': 1}"]),
    (dt.date(2024, 1, 1), ["'date'", "datetime.date(2024, 1, 1)"]),
    ({1}, ["'set'"]),
    (Opaque(), ["'Opaque'", "Opaque()"]),
    ((), ["'tuple'", "empty"]),
    ("\ud800", ["'str'", "surrogate"]),
]


@pytest.mark.parametrize(
    ("key", "fragments"),
    UNHASHABLE,
    ids=[f"{i}-{type(key).__name__}" for i, (key, _) in enumerate(UNHASHABLE)],
)
def test_unhashable_key(key: Any, fragments: list[str]) -> None:
    with pytest.raises(UnhashableKey) as info:
        bucket_id(key, 3000)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value, TypeError)


def test_unhashable_part_names_its_index() -> None:
    with pytest.raises(UnhashableKey, match=r"key part 2 of type 'list' \(\[1\]\)"):
        bucket_id(("a", 1, [1]), 3000)
    with pytest.raises(UnhashableKey, match=r"key part 1 of type 'tuple'.*nested"):
        bucket_id(("a", ("b",)), 3000)


def test_text_format_accepts_large_positive_exponent() -> None:
    # 1E+28 has one digit and scale -28 as text, but 29 digits once expanded for binary.
    bucket_id(Decimal("1E+28"), 3000, decimal_format="text")
    with pytest.raises(UnhashableKey):
        bucket_id(Decimal("1E+29"), 3000, decimal_format="text")


@pytest.mark.parametrize(
    ("key", "scheme", "fragment"),
    [
        (None, "vshard-mpcrc32", "nil key"),
        (None, "vshard-strcrc32", "nil key"),
        (dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "vshard-mpcrc32", "datetime"),
        (Decimal("1"), "vshard-strcrc32", "Decimal"),
        (("a", None), "vshard-strcrc32", "box.NULL"),
        (float("nan"), "vshard-strcrc32", "non-finite"),
        (2.0**64, "vshard-mpcrc32", "2**64"),
        ([1], "vshard-mpcrc32", "tuple"),
    ],
)
def test_vshard_unhashable(key: Any, scheme: str, fragment: str) -> None:
    with pytest.raises(UnhashableKey) as info:
        bucket_id(key, 3000, scheme=scheme)
    assert fragment in str(info.value)


def test_errors_from_python_code_propagate() -> None:
    class BadZone(dt.tzinfo):
        def utcoffset(self, _: dt.datetime | None) -> dt.timedelta:
            raise RuntimeError("boom")

        def dst(self, _: dt.datetime | None) -> None:
            return None

        def tzname(self, _: dt.datetime | None) -> str:
            return "bad"

    with pytest.raises(RuntimeError, match="boom"):
        bucket_id(dt.datetime(2024, 1, 1, tzinfo=BadZone()), 3000)


# --------------------------------------------------------------------------------------------
# Bad arguments


def test_zero_bucket_count_is_value_error() -> None:
    with pytest.raises(ValueError, match="bucket_count") as info:
        bucket_id("a", 0)
    assert not isinstance(info.value, UnhashableKey)


def test_unknown_scheme_is_value_error() -> None:
    with pytest.raises(ValueError, match="murmur"):
        bucket_id("a", 3000, scheme="murmur")


def test_unknown_decimal_format_is_value_error() -> None:
    with pytest.raises(ValueError, match="json"):
        bucket_id(Decimal("1"), 3000, decimal_format="json")


def test_options_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        bucket_id("a", 3000, "picodata")  # type: ignore[call-arg]
