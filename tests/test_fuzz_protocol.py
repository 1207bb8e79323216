"""Protocol fuzzing against a real broker process: whatever arrives on a socket, the broker answers
or closes that connection, keeps serving everyone else, and never dies.

Each example goes to a fresh connection: the frame is sent, the write side is shut (so a frame that
promises more bytes than it carries ends in EOF instead of a wait), and the broker must then close
the connection — or, for a request Kafka legitimately parks (a long-poll Fetch, a JoinGroup waiting
for a rebalance), keep it while still answering a probe connection at once. The default run is
bounded to well under a minute; ``-m slow`` runs many more examples.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcli.broker.dispatch import load_all_handlers
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.kafka_helpers import consume_all, create_topic, produce
from tests.wire_helpers import batch, produce_body

FUZZ_TOPIC = "fuzz-seed"
SUPPORTED = sorted((k, v) for k, h in load_all_handlers().items() for v in range(h.min_version, h.max_version + 1))
API_KEYS = sorted({k for k, _ in SUPPORTED})
PARKED_S = 2.0  # how long an example's connection may stay open without an answer


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("fuzz")
    # Short group delays keep parked JoinGroups brief; everything else is Kafka's default.
    b = BrokerProcess(root / "data", {"group.initial.rebalance.delay.ms": "0"}).start()
    create_topic(b.bootstrap, FUZZ_TOPIC, partitions=2)
    yield b
    rc = b.stop()
    assert rc == 0, f"broker exited {rc}; log:\n{b.log_text()[-3000:]}"


def _seed_bodies() -> dict[int, dict]:
    """Realistic bodies for the APIs whose handlers go deepest; others start from schema zeros."""
    records = batch([b"seed-1", b"seed-2"])
    tp = [{"name": FUZZ_TOPIC, "partition_indexes": [0]}]
    return {
        0: produce_body(FUZZ_TOPIC, 0, records),
        1: {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": FUZZ_TOPIC, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                            "partition_max_bytes": 1 << 20}]}]},
        2: {"replica_id": -1, "topics": [{"name": FUZZ_TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]},
        3: {"topics": [{"name": FUZZ_TOPIC}], "allow_auto_topic_creation": False},
        8: {"group_id": "fuzz-g", "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": FUZZ_TOPIC, "partitions": [{"partition_index": 0, "committed_offset": 1}]}]},
        9: {"group_id": "fuzz-g", "topics": tp},
        10: {"key": "fuzz-g", "key_type": 0, "coordinator_keys": ["fuzz-g"]},
        11: {"group_id": "fuzz-g", "session_timeout": 6000, "rebalance_timeout": 1000, "member_id": "",
             "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"\0\0"}]},
        19: {"topics": [{"name": "fuzz-created", "num_partitions": 1, "replication_factor": 1}], "timeout": 1000},
        21: {"topics": [{"name": FUZZ_TOPIC, "partitions": [{"partition_index": 1, "offset": 0}]}], "timeout": 1000},
        32: {"resources": [{"resource_type": 2, "resource_name": FUZZ_TOPIC, "configuration_keys": None}]},
        37: {"topics": [{"name": FUZZ_TOPIC, "count": 3, "assignments": None}], "timeout": 1000},
    }


_SEEDS = _seed_bodies()


def _valid_frame(api_key: int, version: int) -> bytes:
    body = _SEEDS.get(api_key, {})
    try:
        return WireClient("127.0.0.1:0").encode_request(api_key, version, body)[1]
    except Exception:  # the seed does not fit this version: fall back to schema zeros
        return WireClient("127.0.0.1:0").encode_request(api_key, version, {})[1]


VALID = {kv: _valid_frame(*kv) for kv in SUPPORTED}


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _header(api_key: int, version: int, correlation: int, client_id: bytes | None) -> bytes:
    cid = struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    return struct.pack(">hhi", api_key, version, correlation) + cid


# -- strategies ---------------------------------------------------------------------------------

raw_bytes = st.binary(max_size=300)


@st.composite
def random_bodies(draw: st.DrawFn) -> bytes:
    """A well-formed header (supported key, any version near the range) and a random body."""
    key = draw(st.sampled_from(API_KEYS))
    h = load_all_handlers()[key]
    version = draw(st.integers(h.min_version - 1, h.max_version + 1))
    client_id = draw(st.none() | st.binary(max_size=20))
    header = _header(key, version, draw(st.integers(-(2**31), 2**31 - 1)), client_id)
    flexible_tags = draw(st.sampled_from([b"", b"\0"]))
    return _framed(header + flexible_tags + draw(st.binary(max_size=400)))


@st.composite
def mutated_requests(draw: st.DrawFn) -> bytes:
    """A valid request of a supported key/version, then bit flips, a cut, or garbage appended."""
    frame = bytearray(VALID[draw(st.sampled_from(SUPPORTED))])
    body = frame[4:]
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, len(body) - 1))
        body[pos] ^= 1 << draw(st.integers(0, 7))
    mode = draw(st.sampled_from(["keep", "cut-fixed", "cut-short", "append", "size-lie"]))
    if mode == "cut-fixed":  # shorter frame with a matching size prefix
        body = body[: draw(st.integers(0, len(body)))]
        return _framed(bytes(body))
    if mode == "cut-short":  # the size prefix promises more than is sent
        return struct.pack(">i", len(body)) + bytes(body[: draw(st.integers(0, len(body) - 1))])
    if mode == "append":
        return _framed(bytes(body) + draw(st.binary(min_size=1, max_size=64)))
    if mode == "size-lie":
        return struct.pack(">i", draw(st.integers(-(2**31), 2**31 - 1))) + bytes(body)
    return _framed(bytes(body))


# -- the check ----------------------------------------------------------------------------------


def _api_versions_ok(b: BrokerProcess) -> None:
    """A fresh connection is answered at once: the event loop is not stuck on the last example."""
    with WireClient(b.bootstrap, timeout=5) as c:
        resp = c.request(18, 0, {})
    assert int(resp.error_code) == 0


def _throw(b: BrokerProcess, payload: bytes) -> str:
    """Send one example; return how the broker reacted: 'closed' or 'parked'."""
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return "closed"  # closed while we were still sending
        deadline = time.monotonic() + PARKED_S
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                return "closed"
            if not chunk:
                return "closed"
        return "parked"


_log_seen = {"offset": 0}


def _check(b: BrokerProcess, payload: bytes) -> None:
    _throw(b, payload)
    assert b.alive(), f"broker died on {payload[:80]!r}; log:\n{b.log_text()[-3000:]}"
    _api_versions_ok(b)
    # A handler that raises is survived (the connection is closed) but is still a bug to fix.
    log = b.log_text()
    new, _log_seen["offset"] = log[_log_seen["offset"]:], len(log)
    assert "Traceback" not in new, f"handler crashed on {payload[:120]!r}:\n{new[-3000:]}"


FAST = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SLOW = settings(FAST, max_examples=1500)


@FAST
@given(payload=raw_bytes)
def test_random_bytes(fuzz_broker, payload):
    _check(fuzz_broker, payload)


@FAST
@given(payload=random_bodies())
def test_valid_headers_random_bodies(fuzz_broker, payload):
    _check(fuzz_broker, payload)


@settings(FAST, max_examples=150)
@given(payload=mutated_requests())
def test_mutated_valid_requests(fuzz_broker, payload):
    _check(fuzz_broker, payload)


def test_every_supported_version_unmutated(fuzz_broker):
    """Schema-default bodies of every key/version: each is answered or refused, none kills the broker."""
    for (key, version), frame in VALID.items():
        _check(fuzz_broker, frame)


@pytest.mark.slow
@SLOW
@given(payload=st.one_of(raw_bytes, random_bodies(), mutated_requests()))
def test_fuzz_many(fuzz_broker, payload):
    _check(fuzz_broker, payload)


# -- a SASL listener before authentication -----------------------------------------------------

SASL_PASSWORD = "fuzz-secret"


@pytest.fixture(scope="module")
def sasl_fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    from kcli.security.sasl import UsersFile, hash_password

    root = tmp_path_factory.mktemp("fuzz-sasl")
    users = UsersFile.read(root / "users", missing_ok=True)
    users.set("fuzzer", hash_password(SASL_PASSWORD))
    users.write()
    b = BrokerProcess(root / "data", {"sasl.enabled.mechanisms": "PLAIN", "sasl.plain.users.file": str(root / "users"),
                                      "connection.failed.authentication.delay.ms": "0"}).start()
    yield b
    assert b.stop() == 0, b.log_text()[-3000:]


def _token(user: bytes, password: bytes) -> bytes:
    return b"\0" + user + b"\0" + password


@st.composite
def sasl_exchanges(draw: st.DrawFn) -> bytes:
    """An optional handshake (v0: raw token next; v1: SaslAuthenticate next), then something hostile."""
    c = WireClient("127.0.0.1:0")
    version = draw(st.sampled_from([None, 0, 1]))
    out = b""
    if version is not None:
        out += c.encode_request(17, version, {"mechanism": draw(st.sampled_from(["PLAIN", "PLAIN", "plain", ""]))})[1]
    token = draw(st.one_of(st.binary(max_size=80),
                           st.builds(_token, st.binary(max_size=20), st.binary(max_size=20)),
                           st.just(_token(b"fuzzer", SASL_PASSWORD.encode()))))
    kind = draw(st.sampled_from(["authenticate", "raw", "other-api", "garbage"]))
    if kind == "authenticate":
        frame = bytearray(c.encode_request(36, draw(st.integers(0, 2)), {"auth_bytes": token})[1])
        for _ in range(draw(st.integers(0, 2))):
            frame[draw(st.integers(4, len(frame) - 1))] ^= 1 << draw(st.integers(0, 7))
        out += bytes(frame)
    elif kind == "raw":
        out += _framed(token) if token else b""
    elif kind == "other-api":
        out += VALID[draw(st.sampled_from([kv for kv in SUPPORTED if kv[0] not in (17, 18, 36)]))]
    else:
        out += draw(st.binary(max_size=120))
    return out + draw(st.sampled_from([b"", VALID[(3, 12)]]))  # maybe a request after the exchange


def _authenticated_metadata(b: BrokerProcess) -> None:
    with WireClient(b.bootstrap, timeout=10) as c:
        assert int(c.request(17, 1, {"mechanism": "PLAIN"}).error_code) == 0
        assert int(c.request(36, 2, {"auth_bytes": _token(b"fuzzer", SASL_PASSWORD.encode())}).error_code) == 0
        assert [int(x.node_id) for x in c.request(3, 12, {"topics": None}).brokers] == [1]


@settings(FAST, max_examples=80)
@given(payload=sasl_exchanges())
def test_sasl_listener_before_authentication(sasl_fuzz_broker, payload):
    b = sasl_fuzz_broker
    _throw(b, payload)
    assert b.alive(), f"broker died on {payload[:80]!r}; log:\n{b.log_text()[-3000:]}"
    assert "Traceback" not in b.log_text(), b.log_text()[-3000:]
    _authenticated_metadata(b)


# -- regressions the fuzzer found ----------------------------------------------------------------


@pytest.mark.parametrize("api_key, version, body, length_at, length", [
    (3, 12, {"topics": [{"name": "a"}]}, 0, b"\xff\xff\xff\xff\x0f"),  # compact array: 2^32-2 topics
    (3, 1, {"topics": [{"name": "a"}]}, 0, struct.pack(">i", 0x7FFFFFFF)),  # legacy array: 2^31-1 topics
    (1, 4, _SEEDS[1], 17, struct.pack(">i", 0x7FFFFFFF)),  # Fetch v4: topics array after the fixed fields
])
def test_array_length_bomb_closes_the_connection(fuzz_broker, api_key, version, body, length_at, length):
    """kio reserves memory for a declared array length first: one such frame used to abort the process."""
    frame = bytearray(WireClient("127.0.0.1:0").encode_request(api_key, version, body)[1][4:])
    from kcli.protocol import codec

    _header, pos = codec.read_header(bytes(frame))
    if codec.is_flexible(api_key, version):
        pos = codec._skip_tagged_fields(frame, pos)
    pos += length_at
    old = 1 if codec.is_flexible(api_key, version) else 4
    frame[pos:pos + old] = length
    assert _throw(fuzz_broker, _framed(bytes(frame))) == "closed"
    _check(fuzz_broker, b"")
    assert "claims" in fuzz_broker.log_text()


def test_partition_count_bombs_are_policy_violations(fuzz_broker):
    """2^30 partitions in one request used to stall the event loop; Kafka caps a request at 10000."""
    with WireClient(fuzz_broker.bootstrap, timeout=10) as c:
        ct = c.request(19, 7, {"topics": [{"name": "bomb", "num_partitions": 1 << 30, "replication_factor": 1}],
                               "timeout": 1000})
        assert int(ct.topics[0].error_code) == 44  # POLICY_VIOLATION
        cp = c.request(37, 3, {"topics": [{"name": FUZZ_TOPIC, "count": 1 << 30, "assignments": None}],
                               "timeout": 1000})
        assert int(cp.results[0].error_code) == 44
        md = c.request(3, 12, {"topics": [{"name": "bomb"}], "allow_auto_topic_creation": False})
        assert int(md.topics[0].error_code) == 3  # nothing was created
    _api_versions_ok(fuzz_broker)


def test_broker_serves_real_clients_after_fuzzing(fuzz_broker):
    """Runs last in this module: the fuzzed broker still produces and consumes for confluent-kafka."""
    b = fuzz_broker
    create_topic(b.bootstrap, "after-fuzz")
    values = [f"v{i}".encode() for i in range(20)]
    assert [o for _, o in produce(b.bootstrap, "after-fuzz", values, partition=0)] == list(range(20))
    assert [m.value() for m in consume_all(b.bootstrap, "after-fuzz", 20)] == values
    crashes = [ln for ln in b.log_text().splitlines() if "Traceback" in ln]
    assert not crashes, f"handler crashes during fuzzing; log:\n{b.log_text()[-4000:]}"
