"""Series node-exporter exposes, measured here, against the sizing estimate in
corral/manifests/monitoring.py (NODE_EXPORTER_SERIES, docs/monitoring.md).

Starts Debian's `prometheus-node-exporter` on a free loopback port, reads its
/metrics once, drops what the shards drop (monitoring.NODE_EXPORTER_DROP),
and splits the rest into series with a `cpu` label (they scale with the
machine's CPUs) and the others. A GPU machine's count is extrapolated to
`--cpus` (default 192: two 96-core sockets); devices (network interfaces,
disks, file systems) are counted as they are here, and a GPU machine has more.

    python benchmarks/bench_monitoring_series.py [--cpus 192]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, default=192)
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


if __name__ == "__main__":
    main()
