"""How long `corral plan` takes, and whether cluster size shows up in the resource count.

Targets (issue 3): `corral plan jaguar --format json` under 3 s wall,
interpreter start included. Then resource count and plan time of jaguar
variants: on-prem hosts 100 vs 7,500, cloud pool max 10 vs 5,000 (each in
a temporary clusters folder; the control plane's network is widened to a
/16 so 5,000 machines fit its node subnets). Node counts must not change the
number of resources: they live in the inventory and in group sizes. 1,000+
nodes turn on a dedicated events etcd by default (more machines, by design),
so the variants pin `dedicatedEventsCluster` to compare like with like; the
table also shows the default for 7,500 hosts.

    python benchmarks/bench_plan.py [--runs N]

Wall times depend on the machine's load: the table shows CPU time (user +
sys of the child) beside the wall time, and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "clusters"
TARGET_SECONDS = 3.0

HOSTS_LINE = 'hosts: ["gpu-[001:064].sf1.internal"]'
# The pool's 8 racks would not divide the grown pools: the cases drop them.
RACKS_LINE = '\n    racks: ["sf1-r[01:08]"]'
POOL_MAX = "maxSize: 200"
NETWORK = "networkCIDR: 10.200.0.0/20"
WIDE_NETWORK = "networkCIDR: 10.200.0.0/16"
# 7,500 nodes need 7,500 /24s of pod network: a /11.
POD_NETWORK, WIDE_POD_NETWORK = "podCIDR: 10.128.0.0/14", "podCIDR: 10.128.0.0/11"
ETCD_MEMBERS = "members: 5 "


def run_plan(clusters: Path) -> tuple[float, float, list]:
    """Wall seconds, CPU seconds and the resources of `corral plan jaguar --format json`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "corral", "plan", "jaguar", "--format", "json", "--clusters", str(clusters)],
        cwd=ROOT, capture_output=True, text=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        sys.exit(f"corral plan failed:\n{result.stdout}{result.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(result.stdout)


def variant(folder: Path, edits: dict[str, str]) -> Path:
    """A copy of the example fleet with jaguar.yaml edited (each `old` must occur)."""
    target = folder / "clusters"
    target.mkdir(parents=True)
    for path in EXAMPLES.glob("*.yaml"):
        shutil.copy(path, target / path.name)
    text = (target / "jaguar.yaml").read_text()
    for old, new in edits.items():
        if old not in text:
            sys.exit(f"{old!r} not in jaguar.yaml: update benchmarks/bench_plan.py")
        text = text.replace(old, new, 1)
    (target / "jaguar.yaml").write_text(text)
    return target


def hosts(count: int) -> str:
    # Four-digit names do not collide with the robotics pool's gpu-065..072.
    return f'hosts: ["gpu-[0001:{count:04d}].sf1.internal"]'


def pinned(events: bool) -> dict[str, str]:
    return {NETWORK: WIDE_NETWORK, POD_NETWORK: WIDE_POD_NETWORK, ETCD_MEMBERS: f"members: 5\n    dedicatedEventsCluster: {str(events).lower()} "}


CASES = [
    ("on-prem hosts 100", {**pinned(False), HOSTS_LINE: hosts(100), RACKS_LINE: ""}),
    ("on-prem hosts 7,500", {**pinned(False), HOSTS_LINE: hosts(7_428), RACKS_LINE: ""}),  # + 72 in the other pools
    ("on-prem hosts 7,500, events etcd default", {NETWORK: WIDE_NETWORK, POD_NETWORK: WIDE_POD_NETWORK, HOSTS_LINE: hosts(7_428),
      RACKS_LINE: ""}),
    ("pool max 10", {**pinned(False), POOL_MAX: "maxSize: 10"}),
    ("pool max 5,000", {**pinned(False), POOL_MAX: "maxSize: 5000"}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    rows = []

    def measure(label: str, clusters: Path, target: float | None) -> None:
        samples = [run_plan(clusters) for _ in range(runs)]
        wall = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[1] for s in samples)
        rows.append((label, len(samples[0][2]), wall, cpu, target))

    measure("corral plan jaguar --format json (example)", EXAMPLES, TARGET_SECONDS)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, edits) in enumerate(CASES):
            measure(label, variant(Path(tmp) / str(i), edits), None)

    load = os.getloadavg()[0]
    print(f"corral plan jaguar, median of {runs} runs; load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'case':<44} {'resources':>9} {'wall s':>7} {'cpu s':>6} {'target':>7}")
    for label, count, wall, cpu, target in rows:
        verdict = "" if target is None else (" ok" if wall < target else " SLOW")
        target_text = "" if target is None else f"< {target:.0f} s"
        print(f"{label:<44} {count:>9} {wall:>7.2f} {cpu:>6.2f} {target_text:>7}{verdict}")


if __name__ == "__main__":
    main()
