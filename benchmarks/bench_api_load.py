"""What corral's own in-cluster components ask of the API servers, measured and extrapolated to 7,500 nodes.

Runs the real GPU health agent (corral/health/agent.py, as its pod loads it)
on N simulated nodes against a recording fake API server
(tests/health/fake_apiserver.py, HTTPS), in simulated time
(tests/health/simclock.py): hours of the agents' lives in seconds.

1. rollout: every agent starts within a minute (a DaemonSet rollout);
2. steady state (--hours): kubelets report status every 5 minutes, GPU jobs
   come and go, each node's daily active check falls somewhere in the day;
3. burst (5 minutes): 3 nodes get an Xid 79, 1 node reboots (its agent
   restarts), the pool scales up by 10% (new nodes behind the preflight
   taint, booting over the 5 minutes).

Every request is counted by component, verb and resource, and by what it
costs: a watch (long-running, exempt from --max-requests-inflight), a read
the watch cache serves (resourceVersion set), a read that reaches etcd
(resourceVersion unset: a quorum read), or a write. Rates are extrapolated
linearly per node to 1, 1,000 and 7,500 nodes (the burst's 3 faults and 1
reboot stay 4 nodes; the scale-up is 10% of the nodes).

    python benchmarks/bench_api_load.py [--nodes 40] [--hours 1] [--agent-ref COMMIT]

--agent-ref measures the agent of an older commit (e.g. 1da646e, before
issue 28: a GET of its node, a status PATCH and a pod LIST every 30 s),
driven the way its main() drove it (a round, then sleep(interval_seconds)).
"""

from __future__ import annotations

import argparse
import collections
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from corral.health import addon  # noqa: E402
from corral.model.loader import load_cluster  # noqa: E402
from tests.health.loadsim import SimulatedCluster, load_agent  # noqa: E402

SIZES = (1, 1_000, 7_500)
ROLLOUT_SECONDS, WARMUP_SECONDS, BURST_SECONDS = 60, 600, 300
FAULTED, REBOOTED, SCALE_UP = 3, 1, 0.10
# kube-apiserver defaults per API server (kube-apiserver reference:
# --max-requests-inflight 400, --max-mutating-requests-inflight 200).
MAX_READS_INFLIGHT, MAX_MUTATING_INFLIGHT = 400, 200
# A slow answer under load, to turn a rate into requests in flight (Little's law).
ASSUMED_LATENCY_SECONDS = 1.0
PEAK_WINDOW = 10


def agent_source(ref: str | None, folder: Path) -> Path:
    if ref is None:
        return addon.HERE
    for name in ("agent.py", "classify.py"):
        text = subprocess.run(["git", "show", f"{ref}:corral/health/{name}"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
        (folder / name).write_text(text)
    return folder


def kind(request: dict) -> str:
    return {"watch": "watch", "cache": "cached read", "etcd": "etcd read", "write": "write"}[request["read"]]


def simulate(nodes: int, hours: float, ref: str | None) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-api-load-"))
    source = agent_source(ref, workdir)
    config = addon.agent_config(load_cluster(ROOT / "clusters" / "jaguar.yaml"))
    sim = SimulatedCluster(load_agent(source), config, workdir, legacy=not hasattr(load_agent(source), "Agent"))
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    for name in names:
        # A cluster already running: each node's daily active check is due at its own time of day.
        sim.add_node(name, checked_ago=sim.rng.uniform(0, 24 * 3600))
        sim.clock.at(sim.rng.uniform(0, ROLLOUT_SECONDS), lambda name=name: sim.start_agent(name))
    started = time.monotonic()
    steady_start = WARMUP_SECONDS
    burst_start = steady_start + hours * 3600
    sim.run_until(burst_start)
    hit = names[:FAULTED + REBOOTED]
    for name in hit[:FAULTED]:
        sim.fault(name)
    sim.reboot(hit[FAULTED])
    new = [f"gpu-new-{i:05d}" for i in range(max(1, math.ceil(SCALE_UP * nodes)))]
    for name in new:
        def join(name=name) -> None:
            sim.add_node(name, pending=True, checked_ago=None)
            sim.start_agent(name)
        sim.clock.at(burst_start + sim.rng.uniform(0, BURST_SECONDS), join)
    sim.run_until(burst_start + BURST_SECONDS)
    real = time.monotonic() - started
    result = {
        "nodes": nodes, "hours": hours, "real_seconds": real, "steady": sim.requests(steady_start, burst_start),
        "steady_seconds": burst_start - steady_start, "burst": sim.requests(burst_start, burst_start + BURST_SECONDS),
        "burst_start": burst_start, "hit": set(hit),
        "new": set(new), "n_new": len(new), "legacy": sim.legacy,
    }
    sim.stop()
    return result


def weight(result: dict, request: dict, size: int) -> float:
    """How many requests this one stands for in a cluster of `size` nodes."""
    node = request["node"]
    if result["legacy"]:   # the old agent sent no User-Agent: every node counts alike
        return size / result["nodes"]
    hit = len(result["hit"])
    if node in result["hit"]:
        return min(hit, size) / hit
    if node in result["new"]:
        return SCALE_UP * size / result["n_new"]
    return max(0, size - hit) / (result["nodes"] - hit)


def steady_weight(result: dict, size: int) -> float:
    return size / result["nodes"]


def rates(result: dict) -> tuple[dict, dict, dict]:
    """{(verb, resource, kind): {size: req/s}} at steady state and in the burst, and the burst's peak second."""
    steady, burst = collections.defaultdict(dict), collections.defaultdict(dict)
    for size in SIZES:
        for r in result["steady"]:
            key = (r["verb"], r["resource"], kind(r))
            steady[key][size] = steady[key].get(size, 0) + steady_weight(result, size) / result["steady_seconds"]
        for r in result["burst"]:
            key = (r["verb"], r["resource"], kind(r))
            burst[key][size] = burst[key].get(size, 0) + weight(result, r, size) / BURST_SECONDS
    # The busiest 10 s of the burst (one second is noise with a few dozen simulated nodes).
    peak = {}
    for size in SIZES:
        buckets = collections.Counter()
        for r in result["burst"]:
            if r["read"] != "watch":
                what = "writes" if r["read"] == "write" else "reads"
                buckets[(what, int(r["t"] - result["burst_start"]) // PEAK_WINDOW)] += weight(result, r, size)
        peak[size] = {what: max((v for (w, _), v in buckets.items() if w == what), default=0) / PEAK_WINDOW
                      for what in ("reads", "writes")}
    return steady, burst, peak


def table(title: str, data: dict) -> list[str]:
    lines = [title, f"| verb | resource | kind | {' | '.join(f'{s:,} nodes' for s in SIZES)} |",
             "| --- | --- | --- | " + " | ".join("---:" for _ in SIZES) + " |"]
    totals = collections.defaultdict(float)
    for (verb, resource, what), by_size in sorted(data.items(), key=lambda kv: (kv[0][2] == "watch", kv[0])):
        lines.append(f"| {verb} | {resource} | {what} | " + " | ".join(f"{by_size.get(s, 0):.3f}" for s in SIZES) + " |")
        for s in SIZES:
            totals[(what == "watch", s)] += by_size.get(s, 0)
    lines.append("| **all but watches** | | | " + " | ".join(f"**{totals[(False, s)]:.3f}**" for s in SIZES) + " |")
    lines.append("| watches (re)opened | | | " + " | ".join(f"{totals[(True, s)]:.3f}" for s in SIZES) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=40, help="simulated nodes (each a real agent)")
    parser.add_argument("--hours", type=float, default=1.0, help="simulated hours of steady state")
    parser.add_argument("--agent-ref", help="git commit whose corral/health/agent.py to measure")
    args = parser.parse_args()
    result = simulate(args.nodes, args.hours, args.agent_ref)
    steady, burst, peak = rates(result)
    component = "corral-gpu-health" + (f" at {args.agent_ref}" if args.agent_ref else "")
    print(f"{component}: {args.nodes} simulated nodes, {args.hours:g} h steady + {BURST_SECONDS // 60} min burst "
          f"in {result['real_seconds']:.0f} s real time; requests per second extrapolated linearly per node.\n")
    print("\n".join(table(f"Steady state ({component}), requests/s:", steady)))
    print()
    print("\n".join(table(f"Burst: {FAULTED} Xid faults, {REBOOTED} reboot, +{SCALE_UP:.0%} nodes over "
                          f"{BURST_SECONDS // 60} min ({component}), requests/s averaged over the burst:", burst)))
    print()
    for size in SIZES:
        reads, writes = peak[size]["reads"], peak[size]["writes"]
        print(f"burst peak at {size:,} nodes (busiest {PEAK_WINDOW} s): {reads:.1f} reads/s, {writes:.1f} writes/s; "
              f"at {ASSUMED_LATENCY_SECONDS:g} s each ~{reads * ASSUMED_LATENCY_SECONDS:.0f} reads and "
              f"~{writes * ASSUMED_LATENCY_SECONDS:.0f} writes in flight, against {MAX_READS_INFLIGHT} and "
              f"{MAX_MUTATING_INFLIGHT} on ONE API server ({reads * ASSUMED_LATENCY_SECONDS / MAX_READS_INFLIGHT:.1%}, "
              f"{writes * ASSUMED_LATENCY_SECONDS / MAX_MUTATING_INFLIGHT:.1%})")

if __name__ == "__main__":
    main()
