"""Protocol-level behaviour: idempotence codes, unsupported versions, malformed frames."""

from __future__ import annotations

import socket
import struct

import pytest

from kcli.protocol.client import WireClient
from tests.kafka_helpers import consume_all, create_topic, produce
from tests.wire_helpers import batch, produce_body, produce_result

DUPLICATE_OK = 0
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
CORRUPT_MESSAGE = 2


def test_idempotent_dedupe_gap_and_fencing(broker):
    create_topic(broker.bootstrap, "idem")
    with WireClient(broker.bootstrap) as c:
        init = c.request(22, 4, {"transactional_id": None, "transaction_timeout": 60000,
                                 "producer_id": -1, "producer_epoch": -1})
        pid = int(init.producer_id)
        first = batch([b"a", b"b", b"c"], producer_id=pid, epoch=0, base_sequence=0)
        assert produce_result(c.request(0, 9, produce_body("idem", 0, first))) == (0, 0)
        second = batch([b"d", b"e"], producer_id=pid, epoch=0, base_sequence=3)
        assert produce_result(c.request(0, 9, produce_body("idem", 0, second))) == (0, 3)
        # a retry of the first batch is acknowledged with its original offset and not written again
        assert produce_result(c.request(0, 9, produce_body("idem", 0, first))) == (DUPLICATE_OK, 0)
        gap = batch([b"x"], producer_id=pid, epoch=0, base_sequence=9)
        assert produce_result(c.request(0, 9, produce_body("idem", 0, gap)))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
        # a new epoch fences the old one
        assert produce_result(c.request(0, 9, produce_body("idem", 0, batch([b"n"], producer_id=pid, epoch=1, base_sequence=0)))) == (0, 5)
        stale = batch([b"s"], producer_id=pid, epoch=0, base_sequence=5)
        assert produce_result(c.request(0, 9, produce_body("idem", 0, stale)))[0] == INVALID_PRODUCER_EPOCH
        # a batch with a bad CRC is refused
        bad = bytearray(batch([b"q"]))
        bad[-1] ^= 0xFF
        assert produce_result(c.request(0, 9, produce_body("idem", 0, bytes(bad))))[0] == CORRUPT_MESSAGE
    msgs = consume_all(broker.bootstrap, "idem", 6)
    assert [m.value() for m in msgs] == [b"a", b"b", b"c", b"d", b"e", b"n"]


def test_api_versions_too_new_gets_v0_error_with_key_list(broker):
    with WireClient(broker.bootstrap) as c:
        frame = struct.pack(">hhih", 18, 99, 7, 4) + b"test"
        c.send_raw(struct.pack(">i", len(frame)) + frame)
        data = c.recv_frame()
    cid, err = struct.unpack_from(">ih", data, 0)
    assert cid == 7 and err == 35  # UNSUPPORTED_VERSION
    (n,) = struct.unpack_from(">i", data, 6)
    assert n >= 20


@pytest.mark.parametrize("payload", [
    b"\x00\x00\x00\x02\x00\x00",                              # frame too short for a header
    struct.pack(">i", 12) + struct.pack(">hhih", 999, 0, 1, -1) + b"\0\0",  # unknown API key
    struct.pack(">i", 10) + struct.pack(">hhih", 3, 99, 1, -1),             # unsupported version
    struct.pack(">i", 2_000_000_000),                         # absurd size
    struct.pack(">i", 40) + struct.pack(">hhih", 0, 9, 1, -1) + b"\xff" * 30,  # garbage body
])
def test_malformed_frames_close_only_that_connection(broker, payload):
    s = socket.create_connection((broker.host, broker.port), timeout=10)
    s.sendall(payload)
    s.settimeout(10)
    try:
        assert s.recv(100) == b""  # the broker closed this connection
    except ConnectionResetError:
        pass
    s.close()
    assert broker.alive()
    create_topic(broker.bootstrap, "after-bad-frame")
    assert produce(broker.bootstrap, "after-bad-frame", [b"ok"]) == [(0, 0)]
