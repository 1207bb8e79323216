"""S3 fixtures: moto's real HTTP server on a loopback port, not in-process mocks.

Import all three fixtures into a test module (pytest finds fixtures by name there)::

    from tests.fixtures_s3 import moto_server, s3_env, s3_bucket  # noqa: F401

``s3_bucket`` gives each test a fresh bucket and points the standard AWS environment
(AWS_ENDPOINT_URL, test credentials, us-east-1) at the server, so code under test finds it the
same way it would find real S3.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

_CLEARED = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CA_BUNDLE",
)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Start one moto server for the session; yields its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Point the standard AWS environment at the moto server for one test."""
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    nowhere = tmp_path_factory.mktemp("aws") / "none"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(nowhere))  # ignore the developer's ~/.aws
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return moto_server


_admin_clients: dict[str, object] = {}


def _admin(endpoint: str):
    """One explicitly configured client per server for housekeeping (creating buckets)."""
    client = _admin_clients.get(endpoint)
    if client is None:
        client = _admin_clients[endpoint] = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="test", aws_secret_access_key="test",
        )
    return client


@pytest.fixture(scope="session")
def _moto_admin(moto_server: str) -> object:
    """The housekeeping client as a fixture (kept: other test modules import it)."""
    return _admin(moto_server)


@pytest.fixture
def s3_bucket(s3_env: str) -> str:
    """A new, empty bucket on the moto server; returns its name."""
    name = f"kcli-test-{uuid.uuid4().hex[:16]}"
    _admin(s3_env).create_bucket(Bucket=name)
    return name
