"""How long `corral validate` takes, interpreter start included.

Targets (issue 2): the example fleet under 1 s; a generated fleet of 26
clusters with 7,500 on-prem hosts each under 5 s. The generated fleet is
measured twice: hosts written as rack ranges (`gpu-r001-[01:32]...`, how
operators write them) and one host per line (the worst case).

    python benchmarks/bench_validate.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOSTS = 7_500
CLUSTERS = 26


def cluster_text(index: int, listed: bool) -> str:
    name = f"{string.ascii_lowercase[index]}bench"
    site = f"dc{index}"
    racks = -(-HOSTS // 32)
    if listed:
        hosts = "\n".join(f"      - gpu-{n:05d}.{site}.internal" for n in range(1, HOSTS + 1))
    else:
        last = HOSTS - (racks - 1) * 32
        hosts = "\n".join(
            f'      - "gpu-r{r:03d}-[01:{32 if r < racks else last:02d}].{site}.internal"' for r in range(1, racks + 1)
        )
    return f"""apiVersion: corral.dev/v1
kind: Cluster
name: {name}
kubernetes: {{version: "1.31.4", podCIDR: 10.128.0.0/11}}
controlPlane:
  cloud: azure
  region: eastus2
  zones: ["1", "2", "3"]
  networkCIDR: 10.{200 + index % 50}.0.0/20
  apiServers: {{count: 5, machineType: Standard_D32s_v5}}
  etcd:
    members: 5
    machineType: Standard_E32s_v5
    disk: {{type: PremiumV2_LRS, sizeGiB: 1024, iops: 40000, throughputMBps: 800}}
sites:
  - name: {site}
    cidrs: [10.{index}.0.0/16]
    vpn: {{peerAddress: 203.0.113.{index + 1}, bgpASN: {65000 + index}}}
network:
  flannel: {{mtu: 1350}}  # the Azure VPN gateway carries 1400 - 50 of VXLAN
nodePools:
  - name: gpu-h100
    provider: onprem
    site: {site}
    gpu: {{model: H100, count: 8, driver: "550.127.05", fabricManager: true}}
    roce: {{interfaces: [ens1f0np0], mtu: 9000}}
    hosts:
{hosts}
"""


def timed(args: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run(args, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if result.returncode != 0:
            sys.exit(f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    corral = [sys.executable, "-m", "corral"]
    rows = [("example fleet (3 clusters)", timed([*corral, "validate", "--clusters", str(ROOT / "clusters")], runs), 1.0)]
    for listed in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(CLUSTERS):
                (Path(tmp) / f"{string.ascii_lowercase[i]}bench.yaml").write_text(cluster_text(i, listed))
            label = f"{CLUSTERS} clusters x {HOSTS:,} hosts ({'one per line' if listed else 'rack ranges'})"
            rows.append((label, timed([*corral, "validate", "--clusters", tmp], runs), 5.0))
    print(f"{'case':<52} {'median s':>9} {'target s':>9}")
    for label, seconds, target in rows:
        print(f"{label:<52} {seconds:>9.2f} {target:>9.1f} {'ok' if seconds < target else 'SLOW'}")


if __name__ == "__main__":
    main()
