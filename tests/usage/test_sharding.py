"""The rendered shard configurations in a real Prometheus: every node's targets land on
exactly one shard, and the shards share the nodes about evenly.

Debian's Prometheus has no Kubernetes discovery, so each job's discovery is file
discovery (tests/manifests/test_monitoring.py `for_debian_promtool`) holding the
`__meta_kubernetes_*` labels Kubernetes discovery would give; the relabelling
(hashmod, keep, address, node label) is Prometheus' own, as rendered. The targets
need not answer: only their assignment is checked.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections import Counter

import yaml

from corral.manifests import monitoring
from tests.manifests.test_monitoring import for_debian_promtool, prometheus_files, variant

from .conftest import NEEDS_PROMETHEUS, PrometheusProcess

NODES = [f"gpu-{i:04d}.sf1.internal" for i in range(1, 301)]
SHARDS = 3


def discovered(job: str) -> list[dict]:
    """What Kubernetes discovery would hand the job: one target per node."""
    if job == "kubelet-cadvisor":
        return [{"targets": [f"10.50.{i // 250}.{i % 250 + 1}:10250"],
                 "labels": {"__meta_kubernetes_node_name": node}} for i, node in enumerate(NODES)]
    return [{"targets": [f"10.128.{i // 250}.{i % 250 + 1}:80"],
             "labels": {"__meta_kubernetes_pod_node_name": node,
                        "__meta_kubernetes_pod_ip": f"10.128.{i // 250}.{i % 250 + 1}"}}
            for i, node in enumerate(NODES)]


def active_targets(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=10) as response:
        return json.load(response)["data"]["activeTargets"]


def self_signed_ca() -> bytes:
    """A CA certificate for tls_config.ca_file (Prometheus refuses the pool without a valid one)."""
    from datetime import datetime, timedelta, timezone

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test cluster CA")])
    now = datetime.now(timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' relabel `hashmod`: the last 8 bytes of the value's MD5, big-endian, mod modulus."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def settled_targets(url: str, expected: int) -> list[dict]:
    """The active targets once discovery has delivered `expected` of them (it batches
    updates for ~5 s), and a moment more to see that no others come."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(active_targets(url)) >= expected:
            time.sleep(2)
            return active_targets(url)
        time.sleep(0.5)
    raise AssertionError(f"Prometheus discovered {len(active_targets(url))} of {expected} targets in 60 s")


@NEEDS_PROMETHEUS
def test_each_node_is_scraped_by_exactly_one_shard(tmp_path):
    folder = tmp_path / "clusters"
    folder.mkdir()
    cluster = variant(folder, "jaguar", ("nodePools:\n", f"monitoring: {{shards: {SHARDS}}}\n\nnodePools:\n"))
    files = prometheus_files(cluster)
    ca_pem = self_signed_ca()
    owner: dict[tuple[str, str], int] = {}
    per_shard = Counter()
    for shard in range(SHARDS):
        root = tmp_path / f"shard-{shard}"
        root.mkdir()
        (root / "ca.crt").write_bytes(ca_pem)
        (root / "token").write_text("not-a-token")
        config = yaml.safe_load(files[f"prometheus-shard-{shard}.yml"])
        jobs = [j["job_name"] for j in config["scrape_configs"]]
        assert jobs == ["kubelet-cadvisor", "node-exporter", "dcgm-exporter"]
        for job in jobs:
            (root / f"{job}.json").write_text(json.dumps(discovered(job)))
        config = for_debian_promtool(config, root)
        config["rule_files"] = []
        server = PrometheusProcess(root, yaml.safe_dump(config))
        server.start()
        try:
            mine = [node for node in NODES if hashmod(node, SHARDS) == shard]
            for target in settled_targets(server.url, len(jobs) * len(mine)):
                key = (target["labels"]["job"], target["labels"]["node"])
                assert key not in owner, f"{key} on shards {owner[key]} and {shard}"
                assert target["labels"]["node"] in mine
                owner[key] = shard
                per_shard[shard] += 1
                if target["labels"]["job"] == "kubelet-cadvisor":
                    # The node's own address and the kubelet port, over https.
                    assert target["scrapeUrl"].startswith("https://10.50.")
                    assert target["scrapeUrl"].endswith(":10250/metrics/cadvisor")
        finally:
            server.stop()
    assert set(owner) == {(job, node) for job in jobs for node in NODES}
    # Each job's targets of one node go to one shard, and the split is even enough.
    for node in NODES:
        assert len({owner[(job, node)] for job in jobs}) == 1, node
    mean = len(owner) / SHARDS
    assert all(0.7 * mean < count < 1.3 * mean for count in per_shard.values()), per_shard
    assert monitoring.shard_count(cluster) == SHARDS
