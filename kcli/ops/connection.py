"""Which cluster a command talks to, and confluent-kafka clients that fail fast and quietly.

Resolution order (first hit wins): ``--bootstrap-server``, ``--context``, ``$KCLI_BOOTSTRAP_SERVER``,
the contexts file's current context, ``$KAFKA_BOOTSTRAP_SERVERS``, else the embedded default: a kcli broker already serving
the default data dir, or one booted in this process for the duration of the command (with the
contexts file's ``embedded-broker:`` settings).

librdkafka retries an unreachable cluster forever and logs every attempt to stderr. A CLI
should instead say once that the cluster is unreachable and exit 1, so the clients made here
route librdkafka's log to Python logging (silent unless -v) and turn "all brokers down" or an
authentication failure into a :class:`KafkaApiError` at the next wait.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from kcli import contexts as contexts_file
from kcli.cli.common import GlobalOptions
from kcli.errors import KafkaApiError, OperationError, UsageError

BOOTSTRAP_ENV = "KCLI_BOOTSTRAP_SERVER"
KAFKA_BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"  # the variable Kafka tooling and client images use
DEFAULT_TIMEOUT_S = 30.0

log = logging.getLogger("kcli.ops.connection")


@dataclass
class Connection:
    """Where to connect plus client properties (from a context). ``origin`` says why, for -v."""

    bootstrap: str
    properties: dict[str, str] = field(default_factory=dict)
    origin: str = "--bootstrap-server"
    verbose: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    # A kcli broker another process runs on the default data dir: when that process ends, a
    # client riding out outages would otherwise wait (or time out "successfully") forever.
    broker_pid: int | None = None

    def broker_lost(self) -> str | None:
        """Why the broker process this connection depends on is gone, else None."""
        if self.broker_pid is None or process_alive(self.broker_pid):
            return None
        return f"lost the {self.origin} at {self.bootstrap}: its process {self.broker_pid} ended"

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "client.id": "kcli"}
        conf.update(self.properties)
        conf.update(overrides)
        return conf


# --- resolution ----------------------------------------------------------------------------


def resolve(opts: GlobalOptions, environ: dict[str, str] | None = None) -> Connection | None:
    """The explicitly configured cluster, or None when the embedded default applies.

    Properties come from the context that was named (``--context``) or, when the bootstrap
    itself came from the current context, from that context; a bare ``--bootstrap-server`` or
    ``$KCLI_BOOTSTRAP_SERVER`` uses no properties unless ``--context`` is also given.
    """
    env = os.environ if environ is None else environ
    # An empty -b/--context (`-b "$UNSET"`) is a mistake to report, never "use the default
    # cluster": falling through would silently talk to another cluster.
    named = contexts_file.load().get(opts.context) if opts.context is not None else None
    props = dict(named.properties) if named else {}
    if opts.bootstrap_server is not None:
        return Connection(contexts_file.validate_bootstrap(opts.bootstrap_server), props,
                          "--bootstrap-server", opts.verbose)
    if named is not None:
        return Connection(contexts_file.validate_bootstrap(named.bootstrap_servers, f"context {named.name!r}"),
                          props, f"context {named.name!r}", opts.verbose)
    if env.get(BOOTSTRAP_ENV):
        return Connection(contexts_file.validate_bootstrap(env[BOOTSTRAP_ENV], f"${BOOTSTRAP_ENV}"),
                          {}, f"${BOOTSTRAP_ENV}", opts.verbose)
    current = contexts_file.load().current()
    if current is not None:
        return Connection(contexts_file.validate_bootstrap(current.bootstrap_servers, f"context {current.name!r}"),
                          dict(current.properties), f"current context {current.name!r}", opts.verbose)
    if env.get(KAFKA_BOOTSTRAP_ENV):  # set for other Kafka tools: a cluster was meant, never the embedded one
        return Connection(contexts_file.validate_bootstrap(env[KAFKA_BOOTSTRAP_ENV], f"${KAFKA_BOOTSTRAP_ENV}"),
                          {}, f"${KAFKA_BOOTSTRAP_ENV}", opts.verbose)
    return None


@contextmanager
def connect(opts: GlobalOptions) -> Iterator[Connection]:
    """Yield the Connection for ``opts``; boots the embedded broker when nothing else is set."""
    _configure_client_logging(opts.verbose)
    conn = resolve(opts)
    if conn is not None:
        _say(opts.verbose, f"using {conn.bootstrap} ({conn.origin})")
        yield conn
        return
    try:
        from kcli.broker import embedded
    except ImportError as err:
        raise OperationError(
            "no cluster given (--bootstrap-server, --context, $KCLI_BOOTSTRAP_SERVER, a current context or "
            "$KAFKA_BOOTSTRAP_SERVERS) "
            f"and the embedded broker cannot load: {err}"
        ) from err
    data_dir = embedded.default_data_dir()
    running = embedded.running_broker(data_dir)  # checked: the dir's lock is held, its cluster id matches
    if running is not None:
        _say(opts.verbose, f"using the kcli broker at {running.bootstrap} serving {data_dir} "
                           f"(cluster {running.cluster_id})")
        yield Connection(running.bootstrap, {}, f"kcli broker serving {data_dir}", opts.verbose,
                         broker_pid=running.pid)
        return
    if (data_dir / "broker.json").exists():
        _say(opts.verbose, f"not using {data_dir / 'broker.json'}: its broker is gone or does not hold {data_dir}")
    settings = embedded.embedded_settings(contexts_file.load())
    for note in settings.notes:
        _say(opts.verbose, note)
    _say(opts.verbose, f"starting an embedded broker on {data_dir}")
    with embedded.EmbeddedBroker(data_dir, settings.config) as bootstrap:
        yield Connection(bootstrap, {}, f"embedded broker ({data_dir})", opts.verbose)


def process_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (killed, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _say(verbose: bool, message: str) -> None:
    if verbose:
        sys.stderr.write(f"kcli: {message}\n")


def _configure_client_logging(verbose: bool) -> None:
    """librdkafka logs go to the 'kcli.kafka' logger: stderr with -v, nowhere otherwise."""
    logger = logging.getLogger("kcli.kafka")
    if getattr(logger, "_kcli_configured", None) == verbose:
        return
    logger.handlers.clear()
    logger.propagate = False
    if verbose:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kcli: librdkafka: %(message)s"))
        logger.setLevel(logging.DEBUG)
    else:
        handler = logging.NullHandler()
    logger.addHandler(handler)
    logger._kcli_configured = verbose  # type: ignore[attr-defined]


# --- errors --------------------------------------------------------------------------------

# librdkafka's local (negative) codes → the Kafka error a Java client would report.
_LOCAL_TO_KAFKA = {
    KafkaError._TIMED_OUT: "REQUEST_TIMED_OUT",
    KafkaError._MSG_TIMED_OUT: "REQUEST_TIMED_OUT",
    KafkaError._TRANSPORT: "NETWORK_EXCEPTION",
    KafkaError._ALL_BROKERS_DOWN: "NETWORK_EXCEPTION",
    KafkaError._RESOLVE: "NETWORK_EXCEPTION",
    KafkaError._UNSUPPORTED_FEATURE: "UNSUPPORTED_VERSION",
    KafkaError._AUTHENTICATION: "SASL_AUTHENTICATION_FAILED",
    KafkaError._UNKNOWN_TOPIC: "UNKNOWN_TOPIC_OR_PARTITION",
    KafkaError._UNKNOWN_PARTITION: "UNKNOWN_TOPIC_OR_PARTITION",
    KafkaError._SSL: "SSL_AUTHENTICATION_FAILED",
}


def kafka_error_name(err: KafkaError) -> str:
    """Kafka's upper-case name for ``err`` (librdkafka abbreviates some, e.g. UNKNOWN_TOPIC_OR_PART)."""
    code = err.code()
    if code >= 0:
        from kcli.protocol.errors import error_name  # lazily: kio's tables cost ~0.5 s to import

        return error_name(code)
    return _LOCAL_TO_KAFKA.get(code, (err.name() or f"LOCAL_{-code}").lstrip("_"))


def to_kcli_error(err: KafkaError | BaseException, context: str = "") -> KafkaApiError | UsageError:
    """A confluent-kafka error as a kcli error; ``context`` (e.g. "topic 'x'") prefixes the message."""
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    if not isinstance(err, KafkaError):
        text = str(err) or type(err).__name__
        return KafkaApiError("UNKNOWN_SERVER_ERROR", f"{context}: {text}" if context else text)
    if err.code() == KafkaError._INVALID_ARG:
        return UsageError(f"{context}: {err.str()}" if context else err.str())
    message = err.str() or ""
    for prefix in ("Broker: ", "Local: "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    message = f"{context}: {message}" if context and message else (context or message)
    return KafkaApiError(kafka_error_name(err), message, err.code() if err.code() >= 0 else None)


def _untrusted(err: KafkaError) -> bool:
    """A TLS handshake refused for the broker's certificate: retrying cannot help."""
    return "certificate verify failed" in (err.str() or "")


class ClientErrors:
    """error_cb target: remembers the first error that means no request can succeed."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.fatal: KafkaError | None = None
        self.last_transport: KafkaError | None = None
        self.fail_on_brokers_down = True

    def __call__(self, err: KafkaError) -> None:
        code = err.code()
        if code in (KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._SSL):
            self.last_transport = err
        if self.fatal is not None:
            return
        if err.fatal() or code in (KafkaError._AUTHENTICATION, KafkaError._SSL) or _untrusted(err):
            self.fatal = err
        elif code == KafkaError._ALL_BROKERS_DOWN and self.fail_on_brokers_down:
            self.fatal = self.last_transport or err

    def check(self) -> None:
        if self.fatal is not None:
            if _untrusted(self.fatal):  # librdkafka reports it as _TRANSPORT or _SSL, by timing
                raise KafkaApiError("SSL_AUTHENTICATION_FAILED", f"cannot reach {self.bootstrap}: {self.fatal.str()}")
            if self.fatal.code() in (KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._ALL_BROKERS_DOWN):
                raise to_kcli_error(self.fatal, f"cannot reach {self.bootstrap}")
            raise to_kcli_error(self.fatal)


# --- clients -------------------------------------------------------------------------------


class Admin(AdminClient):
    """AdminClient whose :meth:`wait` fails fast when the cluster is unreachable."""

    errors: ClientErrors
    timeout_s: float

    def wait(self, future: concurrent.futures.Future, context: str = "", timeout_s: float | None = None) -> Any:
        """``future.result()`` as a kcli error, serving callbacks meanwhile."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s) + 5.0
        while not future.done():
            self.errors.check()
            if time.monotonic() > deadline:
                raise KafkaApiError("REQUEST_TIMED_OUT", f"{context or 'request'}: no answer from {self.errors.bootstrap}")
            concurrent.futures.wait([future], timeout=0.05)
            self.poll(0)
        try:
            result = future.result()
        except KafkaException as err:
            raise to_kcli_error(err, context) from err
        # The cluster answered: from now on ALL_BROKERS_DOWN is an outage to ride out, not "cannot
        # reach". librdkafka also reports it, briefly, while it reconnects to brokers it had
        # reached (it dropped the bootstrap entries after the first metadata), e.g. a loaded host.
        self.errors.fail_on_brokers_down = False
        return result


class Producer(confluent_kafka.Producer):
    """confluent-kafka Producer carrying its :class:`ClientErrors` as ``.errors``."""

    errors: ClientErrors


class Consumer(confluent_kafka.Consumer):
    """confluent-kafka Consumer carrying its :class:`ClientErrors` as ``.errors``."""

    errors: ClientErrors


def _client_conf(conn: Connection, errors: ClientErrors, props: dict[str, Any]) -> dict[str, Any]:
    return conn.client_config(error_cb=errors, logger=logging.getLogger("kcli.kafka"), **props)


# Properties librdkafka must never see blank: group.id "" or " " aborts the whole process (an
# assertion in the consumer's constructor); an empty bootstrap.servers would wait on no broker.
_NOT_EMPTY = ("group.id", "bootstrap.servers")


def _construct(cls: type, conf: dict[str, Any]) -> Any:
    for key in _NOT_EMPTY:
        if key in conf and not str(conf[key]).strip():
            raise UsageError(f"client configuration: {key} must not be empty")
    try:
        return cls(conf)
    except KafkaException as err:  # e.g. "No such configuration property"
        raise to_kcli_error(err, "client configuration") from err
    except (ValueError, TypeError) as err:
        raise UsageError(f"client configuration: {err}") from err


def admin(conn: Connection, **props: Any) -> Admin:
    errors = ClientErrors(conn.bootstrap)
    client = _construct(Admin, _client_conf(conn, errors, props))
    client.errors = errors
    client.timeout_s = conn.timeout_s
    return client


def producer(conn: Connection, **props: Any) -> Producer:
    errors = ClientErrors(conn.bootstrap)
    client = _construct(Producer, _client_conf(conn, errors, props))
    client.errors = errors
    return client


def consumer(conn: Connection, **props: Any) -> Consumer:
    errors = ClientErrors(conn.bootstrap)
    client = _construct(Consumer, _client_conf(conn, errors, props))
    client.errors = errors
    return client
