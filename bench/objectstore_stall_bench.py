"""How long diskless produce stalls after the object store's connections die silently.

A broker writes WAL objects to moto's S3 server through a loopback proxy; the proxy black-holes
every connection (no RST, no FIN) for ``--outage`` seconds and then serves only new ones, as
after a NAT or load-balancer drop. Printed: seconds from healing to the first acknowledged
produce (target: <= 10 s; botocore's default 60 s read timeout gave ~57 s).

    python3 bench/objectstore_stall_bench.py [--outage 5] [--rounds 3] [--give-up 120]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

from tests.blackhole_proxy import BlackholeProxy, time_to_first_ack_after_heal  # noqa: E402
from tests.brokerproc import BrokerProcess  # noqa: E402
from tests.diskless_helpers import DISKLESS, FAST  # noqa: E402
from tests.kafka_helpers import create_topic  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import record  # noqa: E402


def one_round(host: str, port: int, outage_s: float, give_up_s: float) -> float | None:
    bucket = f"stall-{uuid.uuid4().hex[:12]}"
    boto3.session.Session().client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                                   aws_access_key_id="test", aws_secret_access_key="test").create_bucket(Bucket=bucket)
    with tempfile.TemporaryDirectory(prefix="kcli-stall-") as tmp, BlackholeProxy((host, port)) as proxy:
        env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
               "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
        b = BrokerProcess(Path(tmp) / "data", FAST, ["--object-store", f"s3://{bucket}/kcli"], env).start()
        try:
            create_topic(b.bootstrap, "stall", 1, DISKLESS)
            return time_to_first_ack_after_heal(b.bootstrap, "stall", proxy, outage_s=outage_s,
                                                give_up_s=give_up_s, log=lambda _m: None)
        finally:
            b.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outage", type=float, default=5.0, help="seconds the store is black-holed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--give-up", type=float, default=120.0, help="seconds to wait after healing")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request lines
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        figures = []
        for i in range(args.rounds):
            stall = one_round(host, port, args.outage, args.give_up)
            shown = f"{stall:.2f} s" if stall is not None else f"> {args.give_up:g} s"
            print(f"round {i + 1}: produce acknowledged {shown} after a {args.outage:g} s silent outage healed", flush=True)
            figures.append(stall if stall is not None else float("inf"))
        print(f"objectstore stall after heal: median {statistics.median(figures):.2f} s, "
              f"max {max(figures):.2f} s over {args.rounds} round(s)")
        record(f"diskless produce stall after a {args.outage:g} s silent store outage heals (median)",
               round(statistics.median(figures), 2), unit="s", target="≤ 10", better="lower")
        record("same, worst round", round(max(figures), 2), unit="s", target="≤ 10", better="lower")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
