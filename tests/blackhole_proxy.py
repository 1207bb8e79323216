"""A loopback TCP proxy that can make connections die silently, as a NAT or load balancer does
when it drops its connection state: no RST, no FIN, the bytes just stop.

``blackhole()`` stops forwarding on every connection (and on any accepted while it lasts); the
proxy stops reading them too, so senders fill their socket buffers and wait. ``heal()`` makes NEW
connections work again; the old ones stay dead until the proxy closes, like after a real NAT
drop. Used by tests/test_objectstore_timeouts.py and bench/objectstore_stall_bench.py.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

_POLL_S = 0.1


@dataclass
class _Conn:
    client: socket.socket
    upstream: socket.socket
    dead: bool = False
    threads: list[threading.Thread] = field(default_factory=list)


class BlackholeProxy:
    """Forward 127.0.0.1:<port> to ``upstream`` (host, port) until closed."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_POLL_S)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: list[_Conn] = []  # kept referenced: a garbage-collected socket would send FIN
        self._blackholed = False
        self._closed = False
        self.accepted = 0
        self._acceptor = threading.Thread(target=self._accept_forever, name="blackhole-accept", daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def blackhole(self) -> None:
        with self._lock:
            self._blackholed = True
            for c in self._conns:
                c.dead = True

    def heal(self) -> None:
        with self._lock:
            self._blackholed = False

    def close(self) -> None:
        self._closed = True
        self._acceptor.join(5)
        self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.dead = True
        for c in conns:
            for t in c.threads:
                t.join(5)
            for s in (c.client, c.upstream):
                try:
                    s.close()
                except OSError:
                    pass

    def __enter__(self) -> "BlackholeProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_forever(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            conn = _Conn(client, upstream)
            with self._lock:
                conn.dead = self._blackholed  # opened during the outage: dead for good
                self._conns.append(conn)
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pump, args=(conn, src, dst), daemon=True, name="blackhole-pump")
                conn.threads.append(t)
                t.start()

    def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket) -> None:
        while not self._closed and not conn.dead:
            try:
                ready, _, _ = select.select([src], [], [], _POLL_S)
            except (OSError, ValueError):
                return
            if not ready or conn.dead:
                continue
            try:
                data = src.recv(65536)
            except OSError:
                return
            if conn.dead:
                return  # swallowed, like a packet into a dropped NAT entry
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)  # pass the FIN on while the path is healthy
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return


def time_to_first_ack_after_heal(bootstrap: str, topic: str, proxy: BlackholeProxy, *, outage_s: float = 5.0,
                                 give_up_s: float = 45.0, log: Callable[[str], Any] = print) -> float | None:
    """Produce one message every 50 ms to ``topic``; black-hole the store for ``outage_s``, heal,
    and return the seconds from healing to the first acknowledgement after it (None: none within
    ``give_up_s``). Messages may be delayed but none may fail within the producer's timeout."""
    from confluent_kafka import Producer

    acks: list[float] = []
    errors: list[Any] = []

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acks.append(time.monotonic())

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                  "message.timeout.ms": 120000})
    stop = threading.Event()

    def produce_forever() -> None:
        i = 0
        while not stop.is_set():
            p.produce(topic, value=b"m-%d" % i, on_delivery=done)
            i += 1
            p.poll(0.05)

    thread = threading.Thread(target=produce_forever, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while len(acks) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(acks) >= 10, f"no produce before the outage: {errors[:3]}"
        proxy.blackhole()
        time.sleep(outage_s)
        proxy.heal()
        healed = time.monotonic()
        log(f"store black-holed for {outage_s:.1f} s, healed; waiting for an acknowledgement")
        deadline = healed + give_up_s
        while time.monotonic() < deadline:
            after = [t for t in acks if t > healed]
            if after:
                return after[0] - healed
            time.sleep(0.05)
        return None
    finally:
        stop.set()
        thread.join(5)
        p.flush(0)
        assert not errors or all(e.retriable() for e in errors), errors[:3]
