"""The MessagePack-RPC codec in the Rust core (``msgpack.wire.FrameDecoder``, ``unpack_value``,
``request``, ``result``) against msgpack-python (``msgpack_reference``): the same values read
from the same bytes however a socket splits them, the same refusals, the same bytes written, the
hot path's messages handed over taken apart, and hostile headers refused before any memory is
spent on them."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardline import _core
from shardline.transport.msgpack import wire
from shardline.transport.task import MalformedMessage
from support import msgpack_reference as reference


def packed(value: Any) -> bytes | None:
    """``value`` packed, or None when msgpack cannot pack it (an int map key is fine)."""
    try:
        return reference.packed(value)
    except (TypeError, ValueError, OverflowError):
        return None


# Every kind of msgpack value, keys other than str among them (which the protocol refuses).
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.floats(width=32).map(lambda f: struct.unpack(">f", struct.pack(">f", f))[0])
    | st.text()
    | st.binary()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5) | st.binary(max_size=3), inner, max_size=4)
        | st.dictionaries(st.integers(-3, 3), inner, min_size=1, max_size=2)
    ),
    max_leaves=12,
)
MSGIDS = st.integers(0, 2**64 - 1)
TIMEOUTS = st.none() | st.floats() | st.integers(-(2**63), 2**64 - 1) | st.booleans()
# A payload or result bin: a packed value (readable or not, as VALUES may hold an int map key),
# or any bytes (mostly unreadable, some a value).
INNER = VALUES.map(lambda value: packed(value) or b"") | st.binary()
# Messages of the protocol, well-formed and not: what a decoder must hand over taken apart and
# what it must leave alone.
MESSAGES = st.one_of(
    st.tuples(
        st.just(0),
        MSGIDS,
        st.just("shardline.dispatch"),
        st.tuples(st.text(), INNER, TIMEOUTS).map(list),
    ).map(list),
    st.tuples(st.just(1), MSGIDS, st.none(), INNER).map(list),
    st.tuples(st.sampled_from([0, 1, 2, True]), VALUES, VALUES, VALUES).map(list),
    st.tuples(
        st.just(0), st.integers(-5, 5), st.just("shardline.dispatch"), st.lists(VALUES, max_size=4)
    ).map(list),
    VALUES,
)


def mutated(data: bytes, draw: st.DataObject) -> bytes:
    """``data`` with a few bytes replaced, inserted or cut off: mostly unreadable msgpack."""
    data = bytearray(data)
    for _ in range(draw.draw(st.integers(0, 3))):
        action = draw.draw(st.sampled_from(["replace", "insert", "cut"]))
        at = draw.draw(st.integers(0, len(data)))
        if action == "replace" and at < len(data):
            data[at] = draw.draw(st.integers(0, 255))
        elif action == "insert":
            data[at:at] = draw.draw(st.binary(min_size=1, max_size=4))
        else:
            del data[at:]
    return bytes(data)


@settings(max_examples=400)
@given(VALUES, st.data())
def test_unpack_value_reads_what_msgpack_python_reads_and_refuses_what_it_refuses(
    value: Any, data: st.DataObject
) -> None:
    raw = packed(value)
    if raw is None:
        return
    if data.draw(st.booleans()):
        raw = mutated(raw, data)
    try:
        expected = reference.model_unpack(raw)
    except reference.Refused:
        with pytest.raises(MalformedMessage, match=r"^the payload is unreadable: "):
            wire.unpack_value(raw, "the payload")
        return
    assert reference.same(wire.unpack_value(raw, "the payload"), expected)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\xc1", "0xc1"),
        (b"\xd4\x01\x00", "extension"),
        (b"\xd6\xff\x00\x00\x00\x00", "extension"),  # the timestamp
        (b"\xc7\x00\x05", "extension"),
        (b"\xa1\xff", "UTF-8"),
        (b"\xa3\xed\xa0\x80", "UTF-8"),  # a surrogate, which UTF-8 cannot carry
        (b"\x81\x01\x02", "map key"),
        (b"\x81\x90\x02", "map key"),
        (b"\x91" * 1024 + b"\x90", "nested deeper than 1024"),
        (b"\x81\xa1k" * 1025 + b"\xc0", "nested deeper than 1024"),
        (b"\x92\x01", "cut short"),
        (b"\xdd\xff\xff\xff\xff", "cut short"),  # 4 billion items announced: nothing allocated
        (b"\x01\x02", "extra bytes"),
        (b"", "cut short"),
    ],
)
def test_unpack_value_refuses_what_the_protocol_does_not_read(raw: bytes, why: str) -> None:
    with pytest.raises(MalformedMessage, match=f"^the result is unreadable: .*{why}"):
        wire.unpack_value(raw, "the result")
    with pytest.raises(reference.Refused):
        reference.model_unpack(raw)


def test_unpack_value_reads_1024_containers_deep_as_msgpack_python_does() -> None:
    raw = b"\x91" * 1023 + b"\x90"
    value = wire.unpack_value(raw, "the result")
    for _ in range(1023):
        (value,) = value
    assert value == []


def feed_split(decoder: wire.FrameDecoder, stream: bytes, cuts: list[int]) -> list[Any]:
    decoded: list[Any] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded.extend(decoder.feed(stream[start:end]))
    return decoded


@settings(max_examples=300)
@given(
    st.lists(MESSAGES, min_size=1, max_size=6),
    st.sampled_from([None, "requests", "answers"]),
    st.data(),
)
def test_the_decoder_hands_over_the_hot_paths_messages_taken_apart_however_the_bytes_are_split(
    messages: list[Any], fast: str | None, data: st.DataObject
) -> None:
    frames = [frame for frame in map(packed, messages) if frame is not None]
    if not frames:
        return
    stream = b"".join(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = wire.FrameDecoder(max(map(len, frames)), fast)
    try:
        values = [reference.model_unpack(frame) for frame in frames]
    except reference.Refused:  # an int map key
        with pytest.raises(MalformedMessage, match="map key"):
            feed_split(decoder, stream, cuts)
        return
    decoded = feed_split(decoder, stream, cuts)
    expected = [values[0], *(reference.taken_apart(value, fast) for value in values[1:])]
    assert reference.same(decoded, expected)


# Nils enough to finish any message a mutated header leaves open that fits in 16-bit lengths.
PADDING = b"\xc0" * 70_000


@settings(max_examples=200)
@given(st.lists(VALUES, min_size=1, max_size=4), st.data())
def test_the_decoder_refuses_what_msgpack_python_refuses_in_a_stream(
    messages: list[Any], data: st.DataObject
) -> None:
    """The stream ends in nils, so that a message a mutation left open is finished: each side
    judges an unfinished message at its own pace (msgpack-python each item as it ends, the
    decoder the message once whole), but both judge a finished one."""
    frames = [frame for frame in map(packed, messages) if frame is not None]
    stream = mutated(b"".join(frames), data) + PADDING
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    decoder = wire.FrameDecoder(len(stream))
    try:
        expected, ends = reference.model_stream(stream)
    except reference.Refused:
        with pytest.raises(MalformedMessage):
            feed_split(decoder, stream, cuts)
        return
    try:
        decoded = feed_split(decoder, stream, cuts)
    except MalformedMessage:
        # a message too large, or an extension type, announced by the headers of a message
        # msgpack-python has not finished either (it judges an extension once whole)
        assert ends[-1:] != [len(stream)], "the decoder refused what msgpack reads whole"
        return
    assert reference.same(decoded, expected)


def test_a_refused_stream_stays_refused() -> None:
    decoder = wire.FrameDecoder(100)
    with pytest.raises(MalformedMessage, match="extension"):
        decoder.feed(b"\x01\xd4\x01\x00")
    with pytest.raises(MalformedMessage, match="refused already"):
        decoder.feed(b"\x01")
    too_large = wire.FrameDecoder(3)
    with pytest.raises(wire.FrameTooLarge) as refused:
        too_large.feed(b"\x94")
    assert refused.value.limit == 3
    with pytest.raises(MalformedMessage):
        too_large.feed(b"\x01")


@pytest.mark.parametrize(
    "header",
    [
        b"\xdd\xff\xff\xff\xff",  # an array of 4 billion items
        b"\xdf\xff\xff\xff\xff",  # a map of 4 billion pairs
        b"\xc6\xff\xff\xff\xff",  # a bin of 4 GiB
        b"\xdb\x00\x10\x00\x00",  # a str of 1 MiB
        b"\x92" + b"\xdc\x01\x00",  # 256 items inside a pair: 261 bytes at least
    ],
)
def test_a_header_announcing_more_than_the_limit_is_refused_before_its_bytes_come(
    header: bytes,
) -> None:
    decoder = wire.FrameDecoder(257)
    with pytest.raises(wire.FrameTooLarge, match="over the limit of 257 bytes"):
        decoder.feed(header)


def test_a_frame_cut_into_single_bytes_is_read_once_whole() -> None:
    message = [1, 2, [list(range(300)), {"k": "v" * 40}], b"\x00" * 70_000]
    frame = reference.packed(message)
    decoder = wire.FrameDecoder(len(frame), "answers")
    decoded = [m for byte in range(len(frame)) for m in decoder.feed(frame[byte : byte + 1])]
    assert decoded == [message]


def test_the_first_message_is_never_taken_apart() -> None:
    """It is the hello; a dispatch in its place must reach the code that refuses it."""
    answer = wire.result(5, b"\xc0")
    assert wire.FrameDecoder(100, "answers").feed(answer * 2) == [
        [1, 5, None, b"\xc0"],
        (5, None),
    ]


@settings(max_examples=100)
@given(st.sampled_from(["requests", "answers"]), st.text(max_size=300), st.integers(1, 64))
def test_a_hot_path_message_of_exactly_the_limit_is_read_and_one_byte_more_refused(
    fast: str, value: str, chunk: int
) -> None:
    """Whatever the reads: the hot path reads a whole message at once, without the scan."""
    if fast == "requests":
        frame = wire.request(3, "echo", wire.pack_value(value, "the payload", "echo"), 1.5)
        expected: Any = (3, "echo", value, 1.5, None)
    else:
        frame = wire.answer(3, value)
        expected = (3, value)
    for limit in (len(frame), len(frame) - 1):
        decoder = wire.FrameDecoder(limit, fast)
        decoder.feed(b"\xc0")  # the first message (the hello's place) is never taken apart
        if limit == len(frame):
            assert feed_split(decoder, frame * 2, list(range(chunk, 2 * len(frame), chunk))) == [
                expected,
                expected,
            ]
        else:
            with pytest.raises(wire.FrameTooLarge):
                feed_split(decoder, frame, list(range(chunk, len(frame), chunk)))


def test_a_handler_named_again_is_handed_over_as_the_same_str() -> None:
    names = ["echo", "echo", "ёж", "ёж", "echo", "e", "echo"]
    frames = [wire.request(n, name, b"\xc0", None) for n, name in enumerate(names)]
    decoder = wire.FrameDecoder(100, "requests")
    decoder.feed(b"\xc0")
    read = [message for frame in frames for message in decoder.feed(frame)]
    assert [message[1] for message in read] == names
    assert read[1][1] is read[0][1]
    assert read[3][1] is read[2][1]


def test_a_decoder_takes_apart_only_known_modes() -> None:
    with pytest.raises(ValueError, match="'requests' or 'answers'"):
        wire.FrameDecoder(100, "both")
    with pytest.raises(ValueError, match="must be positive"):
        wire.FrameDecoder(0)


@settings(max_examples=300)
@given(MSGIDS, st.text(), st.binary(), st.none() | st.floats())
def test_request_writes_the_bytes_msgpack_python_writes(
    msgid: int, handler: str, payload: bytes, timeout: float | None
) -> None:
    expected = reference.packed([0, msgid, "shardline.dispatch", [handler, payload, timeout]])
    assert wire.request(msgid, handler, payload, timeout) == expected
    read = wire.FrameDecoder(len(expected) + 64, "requests")
    read.feed(wire.hello(1))
    taken_apart = reference.taken_apart(reference.model_unpack(expected), "requests")
    assert reference.same(read.feed(expected), [taken_apart])


@settings(max_examples=200)
@given(MSGIDS, st.none() | st.binary())
def test_result_writes_the_bytes_msgpack_python_writes(msgid: int, value: bytes | None) -> None:
    assert wire.result(msgid, value) == reference.packed([1, msgid, None, value])


# Plain values: what `answer` packs itself (str map keys and tuples among them).
PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=5) | st.binary(max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)


class Text(str):
    pass


@settings(max_examples=400)
@given(MSGIDS, PLAIN)
def test_answer_and_pack_value_write_the_bytes_msgpack_python_writes_for_a_plain_value(
    msgid: int, value: Any
) -> None:
    assert wire.answer(msgid, value) == reference.packed([1, msgid, None, reference.packed(value)])
    assert _core.msgpack_plain(value) == reference.packed(value)
    assert wire.pack_value(value, "the payload", "echo") == reference.packed(value)


@pytest.mark.parametrize(
    "value",
    [
        2**64,
        -(2**63) - 1,
        "\ud800",
        Text("a subclass"),
        bytearray(b"x"),
        {1, 2},
        [[1, Text("deep in a list")]],
        {"key": {"nested": 2**70}},
        {Text("key"): 1},
    ],
    ids=repr,
)
def test_answer_leaves_any_other_value_to_msgpack_python(value: Any) -> None:
    assert wire.answer(7, value) is None
    assert _core.msgpack_plain(value) is None


@settings(max_examples=400)
@given(MSGIDS, st.text(), PLAIN, st.none() | st.floats() | st.integers(-(2**70), 2**70))
def test_call_writes_the_request_of_a_plain_payload_as_the_step_by_step_path_does(
    msgid: int, handler: str, value: Any, timeout: float | None
) -> None:
    try:
        seconds = None if timeout is None else max(timeout, 0.0)
        expected = wire.request(
            msgid, handler, wire.pack_value(value, "the payload", handler), seconds
        )
    except (ValueError, OverflowError):  # a surrogate in the handler, an int no float holds
        assert wire.call(msgid, handler, value, timeout) is None
        return
    assert wire.call(msgid, handler, value, timeout) == expected


@pytest.mark.parametrize(
    ("handler", "value", "timeout"),
    [
        ("echo", Text("not plain"), None),
        ("echo", [1, {2, 3}], 1.0),
        ("\ud800", "a surrogate in the handler", None),
        ("echo", "a bool timeout", True),
        ("echo", "a str timeout", "1"),
        ("echo", "an int no float holds", 10**400),
    ],
    ids=repr,
)
def test_call_leaves_any_other_call_to_the_step_by_step_path(
    handler: str, value: Any, timeout: Any
) -> None:
    assert wire.call(1, handler, value, timeout) is None


# bytes values whose packing is 2, 255, 256, 65,535, 65,536 and 200,005 bytes long: the bin
# around it takes a header of 2, 3 or 5 bytes
@pytest.mark.parametrize("length", [0, 253, 254, 65_532, 65_533, 200_000])
def test_answer_and_call_write_every_length_of_bin_as_msgpack_python_does(length: int) -> None:
    """Frames in a row share one scratch buffer: each comes out whole all the same."""
    value = b"x" * length
    for _ in range(2):
        assert wire.answer(9, value) == reference.packed([1, 9, None, reference.packed(value)])
        assert wire.call(9, "echo", value, 1.0) == reference.packed(
            [0, 9, "shardline.dispatch", ["echo", reference.packed(value), 1.0]]
        )
        assert wire.answer(10, "short") == reference.packed([1, 10, None, b"\xa5short"])


def test_answer_packs_64_containers_deep_and_no_deeper() -> None:
    deep: Any = 1
    for _ in range(64):
        deep = [deep]
    assert wire.answer(1, deep) == reference.packed([1, 1, None, reference.packed(deep)])
    assert wire.answer(1, [deep]) is None


def test_a_handler_name_utf8_cannot_carry_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="surrogates not allowed"):
        wire.request(1, "\ud800", b"\xc0", None)
