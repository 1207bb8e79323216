"""A network partition between a partition's leader and the rest of the cluster, in network
namespaces (the issue #26 fault "a leader cut off from PostgreSQL and from its followers"): three
real brokers, each in its own namespace on a bridge (the project's own test hosts, nothing else is
reached), PostgreSQL reached through a forwarder on the bridge. The leader's namespace loses every
route but its own address; a producer inside it keeps writing with acks=all to it. Whatever the
cut-off leader acknowledges must be in the log the rest of the cluster keeps (here: nothing is
acknowledged, since it can neither shrink its ISR nor reach its followers), and the records
acknowledged by the new leader meanwhile survive the heal. About 20 s (not marked slow)."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.replication_cluster import CONFIGS, describe
from tests.test_cluster_state import brokers_of, controller_of, wait_for

NET = "10.231.17"  # the bridge and the three test hosts: addresses inside this test's own namespaces
TAG = f"h17{os.getpid() % 100000}"
BRIDGE = f"kb{TAG}"[:15]
CLONE_NEWNET = 0x40000000


def ns(node: int) -> str:
    return f"k{TAG}n{node}"


def host(node: int) -> str:
    return f"{NET}.{10 + node}"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def enter(namespace: str) -> Any:
    """A preexec_fn: the child joins ``namespace``'s network before it execs."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)

    def join() -> None:
        fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            os._exit(97)
        os.close(fd)

    return join


class Forwarder:
    """TCP from the bridge address to PostgreSQL on the loopback (threads; closed at the end)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.server = socket.create_server((f"{NET}.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.closed = False
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except (socket.timeout, OSError):
                continue
            try:
                up = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            self.socks += [client, up]
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(None)
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        self.server.close()
        for s in self.socks:
            s.close()


@pytest.fixture
def netns_hosts() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    try:
        ip("link", "add", BRIDGE, "type", "bridge")
    except (subprocess.CalledProcessError, FileNotFoundError) as err:
        pytest.skip(f"cannot make a bridge here: {err}")
    try:
        ip("addr", "add", f"{NET}.1/24", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        for n in (1, 2, 3):
            ip("netns", "add", ns(n))
            veth = f"v{TAG}{n}"[:15]
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns(n))
            ip("link", "set", veth, "master", BRIDGE, "up")
            ip("-n", ns(n), "addr", "add", f"{host(n)}/24", "dev", "eth0")
            ip("-n", ns(n), "link", "set", "eth0", "up")
            ip("-n", ns(n), "link", "set", "lo", "up")
        yield
    finally:
        for n in (1, 2, 3):
            subprocess.run(["ip", "netns", "del", ns(n)], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, timeout=10)


def cut(node: int, on: bool) -> None:
    """Every address but the node's own becomes unreachable from its namespace (or again reachable)."""
    for other in [f"{NET}.1"] + [host(n) for n in (1, 2, 3) if n != node]:
        ip("-n", ns(node), "route", "add" if on else "del", "prohibit", f"{other}/32")


PRODUCER = r"""
import json, sys
from confluent_kafka import Producer
boot, topic, count, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": False, "retries": 0,
              "message.timeout.ms": 4000, "request.timeout.ms": 3500})
def done(err, msg):
    if err is None:
        print(json.dumps([msg.value().decode(), msg.offset()]), flush=True)
for i in range(count):
    p.produce(topic, f"{tag}-{i}".encode(), partition=0, on_delivery=done)
p.flush(20)
"""


def produce(bootstrap: str, topic: str, values: list[str]) -> dict[str, int]:
    acked: dict[str, int] = {}
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "message.timeout.ms": 30000})
    for v in values:
        p.produce(topic, v.encode(), partition=0,
                  on_delivery=lambda err, m: acked.__setitem__(m.value().decode(), m.offset()) if err is None else None)
    p.flush(40)
    return acked


def read_all(bootstrap: str, topic: str) -> list[tuple[str, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"n-{uuid.uuid4()}", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[tuple[str, int]] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == -191:  # _PARTITION_EOF
                    break
                continue
            out.append((m.value().decode(), m.offset()))
    finally:
        c.close()
    return out


# Slow: on a busy host (the default suite's two workers) the namespaced brokers' leases, renewed
# through the test process's PostgreSQL forwarder, lag, and the set-up flaps (seen twice in
# clean-clone runs, never alone). A fenced leader is covered in the default run by the SIGSTOP
# test (tests/test_replication_faults.py); run this one with `-m slow` on a quiet host.
@pytest.mark.slow
def test_a_leader_cut_off_from_postgresql_and_its_followers_acknowledges_nothing_the_cluster_loses(
        netns_hosts, pg_server, tmp_path):  # noqa: F811
    forward = Forwarder((pg_server.host, pg_server.port))
    url = f"postgresql://{pg_server.user}@{NET}.1:{forward.port}/{pg_server.create_database()}"
    brokers: dict[int, BrokerProcess] = {}
    try:
        for n in (1, 2, 3):
            b = BrokerProcess(tmp_path / f"node{n}", CONFIGS,
                              ["--cluster", url, "--node-id", str(n), "--rack", "abc"[n - 1]],
                              preexec_fn=enter(ns(n)))
            b.host, b.port = host(n), 9092
            brokers[n] = b.start()
            if n == 1:
                wait_for(lambda: controller_of(brokers[1].bootstrap) == 1, 15, "broker 1 to be the controller")
        boot = ",".join(b.bootstrap for b in brokers.values())
        wait_for(lambda: all(set(brokers_of(b.bootstrap)) == {1, 2, 3} for b in brokers.values()), 20,
                 "three live brokers, as every broker sees them (CreateTopics checks the assignment where it lands)")
        admin = AdminClient({"bootstrap.servers": boot})
        def created() -> bool:
            try:  # a broker's lease may lag behind its Metadata listing: retried while it does
                admin.create_topics([NewTopic("np", 1, replica_assignment=[[2, 1, 3]],
                                              config={"min.insync.replicas": "2"})])["np"].result(20)
            except KafkaException as err:
                if err.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT:
                    return False
                if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            return True

        wait_for(created, 30, "topic np on brokers 2, 1, 3")
        wait_for(lambda: len(describe(boot, "np")[0].isrs) == 3, 20, "the ISR of np")
        acked = produce(boot, "np", [f"before-{i}" for i in range(100)])
        assert len(acked) == 100

        cut(2, True)  # the leader (not the controller) loses PostgreSQL and both followers
        inside = subprocess.run([sys.executable, "-c", PRODUCER, brokers[2].bootstrap, "np", "50", "cutoff"],
                                capture_output=True, timeout=60, preexec_fn=enter(ns(2)), text=True)
        cut_acked = dict(json.loads(line) for line in inside.stdout.splitlines() if line.strip())
        wait_for(lambda: describe(f"{host(1)}:9092", "np")[0].leader in (1, 3), 20, "a new leader")
        during = produce(f"{host(1)}:9092,{host(3)}:9092", "np", [f"during-{i}" for i in range(100)])
        assert len(during) == 100
        acked.update(during)

        cut(2, False)
        wait_for(lambda: len(describe(boot, "np")[0].isrs) == 3, 40, "broker 2 back in the ISR")
        log = read_all(boot, "np")
        final = dict(log)
        assert [o for _v, o in log] == list(range(len(log)))  # contiguous, no duplicate offset
        for v, o in {**acked, **cut_acked}.items():  # nothing acknowledged is lost, at its offset
            assert final.get(v) == o, (v, o, final.get(v))
        assert cut_acked == {}, cut_acked  # and the cut-off leader acknowledged nothing
    finally:
        for b in brokers.values():
            b.stop()
        forward.close()
