"""Shared fixture of the etcd tests: three real etcd members on loopback with TLS."""

from __future__ import annotations

import pytest

from .local import LocalCluster


@pytest.fixture
def local3(tmp_path):
    cluster = LocalCluster(tmp_path).boot(["m0", "m1", "m2"])
    try:
        yield cluster
    finally:
        cluster.stop()
