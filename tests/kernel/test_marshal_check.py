"""``check_marshal`` (``_kernel/_frames``): the walk that vets a peer's marshal
data (routing headers, cast-tree headers, batches of replies, handshakes)
before ``marshal.loads`` sees it.

Its contract: what monarch sends is accepted; anything cut short, of an
announced size beyond the bytes present, or of a type monarch never sends is
rejected with a :class:`ProtocolError` that names the peer and the problem
-- and nothing else ever escapes it (it detects truncation by reading past
the end, so an ``IndexError`` or ``struct.error`` leaking out would be a bug).
"""

from __future__ import annotations

import marshal
import random
import re

import pytest

from monarch_core._kernel import _wire as W
from monarch_core.errors import ProtocolError

pytestmark = pytest.mark.unit

_MSG = ("actor_key_1", "method", ("proc_a", "tcp://10.0.0.1:1234", 77), ("hosts", "gpus"), (2, 8), "sender", None,
        False, None)

#: marshal data of every shape monarch sends, by name
SAMPLES = {
    "routing header": marshal.dumps(("key", "ep", None, 3, ("hosts",), (4,), "sender", None, None, True)),
    "cast-tree header": marshal.dumps(
        (_MSG, 64, 8, 0, [(i, i) for i in range(8)], {i: (f"proc_{i}", f"tcp://10.0.0.{i}:5000") for i in range(64)},
         "view", True)
    ),
    "batch of replies": marshal.dumps([(i, 0, b"\x80\x05N." * 4, 0) for i in range(16)]),
    "handshake": marshal.dumps({"proc": "p" * 40, "session": "a" * 32, "address": "tcp://1.2.3.4:5", "last": 9}),
    "wide values": marshal.dumps(
        (3, 2**40, -(2**70), 1.5, "é" * 300, "x" * 300, b"y" * 300, frozenset({1, 2}), [1, [2]], {"a": (1,)})
    ),
}

_REJECTED = re.compile(r"^peer p sent a malformed thing \((truncated|bad length -?\d+|sequence of -?\d+ items|"
                       r"bad reference|unsupported type code \d+)\)$")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_what_monarch_sends_is_accepted(name: str) -> None:
    W.check_marshal(SAMPLES[name], "p", "thing")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_truncation_is_a_protocol_error(name: str) -> None:
    data = SAMPLES[name]
    for cut in range(len(data)):
        with pytest.raises(ProtocolError) as e:
            W.check_marshal(data[:cut], "p", "thing")
        assert _REJECTED.match(str(e.value)), (cut, str(e.value))
        assert e.value.__context__ is None, cut  # (raised afresh: no internal error chained to it)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_corrupted_data_is_accepted_or_a_protocol_error_and_nothing_else(name: str) -> None:
    rng = random.Random(name)
    data = SAMPLES[name]
    for _ in range(1500):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            W.check_marshal(bytes(b), "p", "thing")
        except ProtocolError as e:
            assert _REJECTED.match(str(e)), (bytes(b), str(e))


@pytest.mark.parametrize(
    "data, problem",
    [
        (b"(\xff\xff\xff\x7f", "sequence of 2147483647 items"),  # a tuple announcing 2**31-1 items
        (b"u\x00\x00\x00\x10abc", "bad length 268435456"),  # a string announcing 256 MiB
        (b"r\x00\x00\x00\x00", "bad reference"),  # a back-reference to nothing
        (b"c" + b"\x00" * 40, "unsupported type code 99"),  # a code object
    ],
    ids=["huge-tuple", "huge-string", "dangling-ref", "code-object"],
)
def test_announced_sizes_and_foreign_types_are_rejected_before_loading(data: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(f"peer p sent a malformed thing ({problem})")):
        W.check_marshal(data, "p", "thing")
