"""Series node-exporter exposes, measured here, against the sizing estimate in
corral/manifests/monitoring.py (NODE_EXPORTER_SERIES, docs/monitoring.md).

Starts Debian's `prometheus-node-exporter` on a free loopback port, reads its
/metrics once, drops what the shards drop (monitoring.NODE_EXPORTER_DROP),
and splits the rest into series with a `cpu` label (they scale with the
machine's CPUs) and the others. A GPU machine's count is extrapolated to
`--cpus` (default 192: two 96-core sockets); devices (network interfaces,
disks, file systems) are counted as they are here, and a GPU machine has more.

Then the load per Prometheus shard of a cluster of `--nodes` nodes with
`--gpus` GPUs each (issue 28, item 5): nodes per shard (corral's rule, one
shard per 1,000 nodes; hashmod spreads node names evenly), active series per
shard (this measurement for node-exporter, cAdvisor's and dcgm-exporter's
per-node figures from monitoring.py), samples per second at the 30 s scrape
interval, against a maintainer's guidance per server (PromLabs, Julius Volz,
"Introduction to Prometheus: Efficient Implementation": "a single large
Prometheus server can ingest up to 1 million time series samples per second
... It can handle several million concurrently active ... time series").

    python benchmarks/bench_monitoring_series.py [--cpus 192] [--nodes 7500 --gpus 8]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corral.manifests import monitoring  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(binary: str) -> str:
    port = free_port()
    # The DaemonSet's file system exclusion (templates/manifests/monitoring.yaml.j2).
    exclude = "--collector.filesystem.mount-points-exclude=^/(dev|proc|sys|run/containerd/.+|var/lib/kubelet/.+)($|/)"
    process = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}", exclude],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    return response.read().decode()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        process.terminate()
        process.wait(timeout=10)


# PromLabs' rule of thumb for one large Prometheus server (module docstring).
GUIDANCE_SAMPLES_PER_SECOND = 1_000_000
GUIDANCE_ACTIVE_SERIES = 2_000_000  # "several million": the low end


def shard_load(node_exporter_series: float, nodes: int, gpus: int, shards: int) -> dict[str, float]:
    """One shard's nodes, active series and samples/s (the mean shard and the sized one, +10%)."""
    per_node = node_exporter_series + monitoring.CADVISOR_SERIES + monitoring.DCGM_SERIES_PER_GPU * gpus
    mean_nodes = nodes / shards
    series = per_node * mean_nodes
    return {
        "per_node": per_node,
        "mean_nodes": mean_nodes,
        "series": series,
        "samples_per_second": series / monitoring.SCRAPE_INTERVAL_SECONDS,
        "unlucky_series": series * 1.1,
    }


def report_shards(node_exporter_series: float, nodes: int, gpus: int, shards: int, what: str) -> None:
    load = shard_load(node_exporter_series, nodes, gpus, shards)
    print(f"{nodes:,} nodes x {gpus} GPUs in {shards} shards (one per {monitoring.NODES_PER_SHARD:,} nodes):")
    print(f"  per node: {load['per_node']:.0f} series ({node_exporter_series:.0f} node-exporter {what}, "
          f"{monitoring.CADVISOR_SERIES} cAdvisor, {gpus} x {monitoring.DCGM_SERIES_PER_GPU} dcgm-exporter)")
    print(f"  per shard: {load['mean_nodes']:.0f} nodes, {load['series'] / 1e6:.2f} M active series "
          f"({load['unlucky_series'] / 1e6:.2f} M on a shard 10% over the mean), "
          f"{load['samples_per_second']:,.0f} samples/s at a {monitoring.SCRAPE_INTERVAL_SECONDS} s interval")
    print(f"  against one server's guidance: {load['samples_per_second'] / GUIDANCE_SAMPLES_PER_SECOND:.0%} of "
          f"1 M samples/s; {load['unlucky_series'] / 1e6:.1f} M active series, within its \"several million\" "
          f"({load['unlucky_series'] / GUIDANCE_ACTIVE_SERIES:.1f}x its low end, 2 M)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, default=192)
    parser.add_argument("--nodes", type=int, default=7_500, help="cluster nodes for the per-shard load")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--shards", type=int, default=None, help="default: one per 1,000 nodes (monitoring.py)")
    args = parser.parse_args()
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        sys.exit("needs node-exporter: apt-get install prometheus-node-exporter")
    dropped = re.compile(f"({'|'.join(monitoring.NODE_EXPORTER_DROP)})")
    per_cpu, per_device, other = Counter(), Counter(), Counter()
    for line in scrape(binary).splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if dropped.fullmatch(name) or name.startswith(("go_", "process_", "promhttp_")):
            continue
        if 'cpu="' in line:
            per_cpu[name] += 1
        elif 'device="' in line or 'mountpoint="' in line:
            per_device[name] += 1
        else:
            other[name] += 1
    cpus = os.cpu_count() or 1
    per_one_cpu = sum(per_cpu.values()) / cpus
    print(f"node-exporter {binary}, this machine: {cpus} CPUs")
    print(f"  series with a cpu label: {sum(per_cpu.values())} ({per_one_cpu:.1f} per CPU; "
          f"largest: {', '.join(f'{n} {c}' for n, c in per_cpu.most_common(3))})")
    print(f"  series per device/mountpoint: {sum(per_device.values())} "
          f"(largest: {', '.join(f'{n} {c}' for n, c in per_device.most_common(3))})")
    print(f"  other series: {sum(other.values())}")
    estimate = per_one_cpu * args.cpus + sum(per_device.values()) + sum(other.values())
    print(f"  at {args.cpus} CPUs, the same devices: {estimate:.0f} series "
          f"(sizing assumes {monitoring.NODE_EXPORTER_SERIES}: bare metal adds per-CPU frequency "
          "series and more NICs and disks than this machine)")
    shards = args.shards or max(1, math.ceil(args.nodes / monitoring.NODES_PER_SHARD))
    report_shards(estimate, args.nodes, args.gpus, shards, f"measured, at {args.cpus} CPUs")
    report_shards(monitoring.NODE_EXPORTER_SERIES, args.nodes, args.gpus, shards, "as monitoring.py sizes it")


if __name__ == "__main__":
    main()
