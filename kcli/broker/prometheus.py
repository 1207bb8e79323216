"""The Prometheus endpoint (`kcli broker start --metrics-listen HOST:PORT`, config metrics.listen).

Everything exported is read at scrape time from the broker's one :class:`~kcli.broker.metrics.Metrics`
registry (the same counters `kcli broker metrics` shows) and from broker state (group lag, tiering
lag), under Kafka's JMX names in the JMX exporter's style where Kafka has the metric
(docs/observability.md lists the mapping). The HTTP side runs on the broker's event loop, so a
scrape reads state the loop owns without locks; it answers GET /metrics only, with timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from kcli.broker.metrics import Labels, Summary

if TYPE_CHECKING:
    from kcli.broker.broker import Broker

log = logging.getLogger("kcli.broker.metrics")

READ_TIMEOUT_S = 10.0  # a client that sends no complete request head in this time is dropped
MAX_HEAD_BYTES = 16 * 1024
CLOSE_TIMEOUT_S = 5.0

# internal name -> (exported name, help). Labelled series (per API, per topic).
KAFKA_NAMES: dict[str, tuple[str, str]] = {
    "requests": ("kafka_network_requestmetrics_requests", "Requests answered, per API (RequestMetrics RequestsPerSec)."),
    "request.errors": ("kafka_network_requestmetrics_errors", "Requests whose handler failed, per API and error (RequestMetrics ErrorsPerSec)."),
    "request.total_time_ms": ("kafka_network_requestmetrics_totaltimems", "Time from reading a request to its encoded response, ms (RequestMetrics TotalTimeMs)."),
    "topic.bytes_in": ("kafka_server_brokertopicmetrics_bytesin", "Bytes appended by producers, per topic (BrokerTopicMetrics BytesInPerSec)."),
    "topic.bytes_out": ("kafka_server_brokertopicmetrics_bytesout", "Bytes sent to consumers, per topic (BrokerTopicMetrics BytesOutPerSec)."),
    "topic.messages_in": ("kafka_server_brokertopicmetrics_messagesin", "Records appended, per topic (BrokerTopicMetrics MessagesInPerSec)."),
    "tiered.bytes.copied": ("kafka_server_brokertopicmetrics_remotecopybytes", "Bytes copied to remote storage (BrokerTopicMetrics RemoteCopyBytesPerSec)."),
    "tiered.remote.fetch.bytes": ("kafka_server_brokertopicmetrics_remotefetchbytes", "Bytes read from remote storage (BrokerTopicMetrics RemoteFetchBytesPerSec)."),
    # Kafka checks CRCs on produce only (InvalidMessageCrcRecordsPerSec); kcli also checks every batch it
    # reads from object storage, and names that meter the way Kafka names its fetch meters.
    "fetch.corrupt.batches": ("kafka_server_brokertopicmetrics_corruptfetchbatches",
                              "Batches read from object storage (source diskless: WAL objects, tiered: remote segments) "
                              "that failed their CRC-32C or header check and were answered CORRUPT_MESSAGE instead of "
                              "served (BrokerTopicMetrics CorruptFetchBatchesPerSec, kcli's)."),
    # Replication of classic partitions (kcli/broker/replica/)
    "replica.under_replicated_partitions": ("kafka_server_replicamanager_underreplicatedpartitions",
                                            "Partitions this broker leads whose ISR is smaller than their replicas (ReplicaManager UnderReplicatedPartitions)."),
    "replica.under_min_isr_partitions": ("kafka_server_replicamanager_underminisrpartitioncount",
                                         "Partitions this broker leads whose ISR is below min.insync.replicas (ReplicaManager UnderMinIsrPartitionCount)."),
    "replica.offline_partitions": ("kafka_controller_kafkacontroller_offlinepartitionscount",
                                   "Replicated partitions without a live leader, on the controller (KafkaController OfflinePartitionsCount)."),
    "replica.leader_count": ("kafka_server_replicamanager_leadercount", "Replicated partitions this broker leads (ReplicaManager LeaderCount)."),
    "replica.isr_shrinks": ("kafka_server_replicamanager_isrshrinks", "ISR shrinks committed by this broker as leader (ReplicaManager IsrShrinksPerSec)."),
    "replica.isr_expands": ("kafka_server_replicamanager_isrexpands", "ISR expansions committed by this broker as leader (ReplicaManager IsrExpandsPerSec)."),
    "replica.max_lag": ("kafka_server_replicafetchermanager_maxlag",
                        "Largest lag in records of a follower behind this broker's log end, over the partitions it leads (ReplicaFetcherManager MaxLag)."),
}
# Counters exported with 0 before their first event (alerts on increase() need a series): name -> label sets.
ZERO_FROM_START: dict[str, tuple[tuple[tuple[str, str], ...], ...]] = {
    "fetch.corrupt.batches": ((("source", "diskless"),), (("source", "tiered"),)),
    "replica.isr_shrinks": ((),),
    "replica.isr_expands": ((),),
}
# Object-store failures, one family with the operation as a label.
OBJECT_STORE_ERRORS = {"diskless.upload.errors": "put", "diskless.get.errors": "get", "diskless.cleaner.errors": "delete"}
COORDINATOR_ERRORS = {"diskless.commit.errors": "commit", "diskless.upload.intent_errors": "register_upload_intent"}
_TAGGED = re.compile(r"^(?P<name>[^{]+)\{(?P<tags>[^}]*)\}$")  # background.task.failures{task=tiered-copy}


def exported_name(internal: str) -> str:
    """kcli's own metrics: ``kcli_`` + the dotted name with ``_``; Kafka's under their JMX name."""
    if internal in KAFKA_NAMES:
        return KAFKA_NAMES[internal][0]
    return "kcli_" + re.sub(r"[^a-zA-Z0-9_]", "_", internal)


def split_tags(name: str) -> tuple[str, Labels]:
    m = _TAGGED.match(name)
    if m is None:
        return name, ()
    tags = tuple(sorted(tuple(kv.split("=", 1)) for kv in m.group("tags").split(",") if "=" in kv))
    return m.group("name"), tags  # type: ignore[return-value]


def _help(internal: str) -> str:
    return KAFKA_NAMES[internal][1] if internal in KAFKA_NAMES else f"kcli metric {internal}."


def _buckets(s: Summary) -> list[tuple[str, float]]:
    out, running = [], 0
    counts = s.buckets or [0] * len(s.bounds)
    for bound, n in zip(s.bounds, counts):
        running += n
        out.append((repr(float(bound)), float(running)))
    out.append(("+Inf", float(s.count)))
    return out


class BrokerCollector:
    """Turns the broker's registry and state into metric families at each scrape."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        m = self.broker.metrics
        counters: dict[str, dict[Labels, float]] = {}
        for name, value in m.counters.items():
            base, tags = split_tags(name)
            if base in OBJECT_STORE_ERRORS:
                base, tags = "objectstore.errors", (("operation", OBJECT_STORE_ERRORS[base]),)
            elif base in COORDINATOR_ERRORS:
                base, tags = "diskless.coordinator.errors", (("operation", COORDINATOR_ERRORS[base]),)
            counters.setdefault(base, {})[tags] = value
        for name, series in m.labelled_counters.items():
            counters.setdefault(name, {}).update(series)
        for name in ("objectstore.errors", "diskless.coordinator.errors"):  # present from the start: alerts need a 0
            table = OBJECT_STORE_ERRORS if name == "objectstore.errors" else COORDINATOR_ERRORS
            for op in table.values():
                counters.setdefault(name, {}).setdefault((("operation", op),), 0)
        for name, label_sets in ZERO_FROM_START.items():
            for labels in label_sets:
                counters.setdefault(name, {}).setdefault(labels, 0)
        for name, series in sorted(counters.items()):
            yield _family(CounterMetricFamily, name, series, lambda fam, labels, v: fam.add_metric(labels, v))
        histograms: dict[str, dict[Labels, Summary]] = {}
        for name, summary in m.summaries.items():
            base, tags = split_tags(name)
            histograms.setdefault(base, {})[tags] = summary
        for name, hseries in m.labelled_summaries.items():
            histograms.setdefault(name, {}).update(hseries)
        for name, hs in sorted(histograms.items()):
            yield _family(HistogramMetricFamily, name, hs,
                          lambda fam, labels, s: fam.add_metric(labels, _buckets(s), sum_value=s.total))
        gauges: dict[str, dict[Labels, float]] = {}
        for name, fn in m.gauges.items():
            try:
                value = fn()
            except Exception:  # noqa: BLE001 - one broken gauge must not fail the scrape
                log.debug("gauge %s failed", name, exc_info=True)
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                base, tags = split_tags(name)
                gauges.setdefault(base, {})[tags] = float(value)
        for name, gseries in sorted(gauges.items()):
            yield _family(GaugeMetricFamily, name, gseries, lambda fam, labels, v: fam.add_metric(labels, v))
        yield from self._state()

    def _state(self) -> Iterator[Metric]:
        b = self.broker
        info = GaugeMetricFamily("kcli_broker_info", "This broker: node id, cluster id, kcli version (value 1).",
                                 labels=["node_id", "cluster_id", "version"])
        info.add_metric([str(b.node_id), b.cluster_id or "", _version()], 1)
        yield info
        yield GaugeMetricFamily("kafka_server_kafkaserver_brokerstate", "3 while running (KafkaServer BrokerState RUNNING).",
                                value=3 if not b.stopping else 6)
        if b.tiered is not None:
            segs = GaugeMetricFamily("kafka_server_brokertopicmetrics_remotecopylagsegments",
                                     "Rolled local segments not yet copied to remote storage (RemoteCopyLagSegments).",
                                     labels=["topic"])
            size = GaugeMetricFamily("kafka_server_brokertopicmetrics_remotecopylagbytes",
                                     "Bytes of rolled local segments not yet copied (RemoteCopyLagBytes).", labels=["topic"])
            for topic, (n, nbytes) in sorted(b.tiered.copy_lag().items()):
                segs.add_metric([topic], n)
                size.add_metric([topic], nbytes)
            yield segs
            yield size
        yield from self._group_lag()

    def _group_lag(self) -> Iterator[Metric]:
        """Per group coordinated here: committed offset and lag (log end - committed), named as
        kafka_exporter names them, since Kafka's broker has no such metric."""
        b = self.broker
        current = GaugeMetricFamily("kafka_consumergroup_current_offset", "Committed offset, per group and partition.",
                                    labels=["consumergroup", "topic", "partition"])
        lag = GaugeMetricFamily("kafka_consumergroup_lag", "Log end offset minus committed offset, per group and partition.",
                                labels=["consumergroup", "topic", "partition"])
        groups = b.groups
        if groups is not None and groups.active:
            for gid in sorted(groups.groups):
                for (topic, partition), offset in sorted(groups.committed_offsets(gid).items()):
                    t = b.topic(topic)
                    if t is None or partition not in t.partitions:
                        continue
                    end, _start = b.partition_offsets(t, partition)
                    labels = [gid, topic, str(partition)]
                    current.add_metric(labels, offset)
                    if end >= 0:  # known here (a classic partition another broker hosts is not)
                        lag.add_metric(labels, max(0, end - offset))
        yield current
        yield lag


def _family(cls: Any, internal: str, series: dict[Labels, Any], add: Any) -> Metric:
    label_names = sorted({k for labels in series for k, _ in labels})
    fam = cls(exported_name(internal), _help(internal), labels=label_names)
    for labels, value in sorted(series.items()):
        d = dict(labels)
        add(fam, [d.get(k, "") for k in label_names], value)
    return fam


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kcli-kafka")
    except PackageNotFoundError:
        return "unknown"


def build_registry(broker: "Broker") -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class MetricsExporter:
    """A minimal HTTP/1.0 server for GET /metrics on the broker's event loop."""

    def __init__(self, broker: "Broker", host: str, port: int) -> None:
        self.broker = broker
        self.host, self.port = host, port
        self.registry = build_registry(broker)
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.Task[Any]] = set()

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]
        return self.address

    async def close(self) -> None:
        """Stop accepting, drop scrapes in flight; bounded by CLOSE_TIMEOUT_S."""
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=CLOSE_TIMEOUT_S)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), CLOSE_TIMEOUT_S)
            except asyncio.TimeoutError:
                log.warning("metrics endpoint on %s did not close within %.0f s", self.address, CLOSE_TIMEOUT_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            if len(head) > MAX_HEAD_BYTES:
                return
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1]) if len(parts) >= 2 else (b"", b"")
            if method not in (b"GET", b"HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET /metrics\n"
            elif path.split(b"?", 1)[0] in (b"/metrics", b"/"):
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"metrics are at /metrics\n"
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + (body if method == b"GET" else b""))
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT_S)
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            self._clients.discard(task)
