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

    python benchmarks/bench_api_load.py --component node-approver [--nodes 1000 7500] [--hours 2]
        [--approver-ref COMMIT]

measures corral-node-approver (one replica) at each size: requests, and the
objects its reads carry (list items, watch events). --approver-ref 390fa76 is
the approver before issue 28 item 2 (CSR LIST every 5 s, node LIST every
30 s, both from etcd).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
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

# --- corral-node-approver (one replica): what it reads as the cluster grows -------------------
#
# Not per node: one approver, so it is simulated at each size (not extrapolated).
# Around it (tests/certs/fake_csr_apiserver.py FakeApproverCluster, the recording
# watch fake taught CSRs and "!key" label selectors): N labelled pool nodes and the
# 3 API servers (never labelled), each kubelet posting status every 5 minutes; a
# steady hour; then a 5-minute burst of +10% nodes joining (a CSR, approved, then
# the Node, labelled). Besides requests it counts the objects the reads carry (list
# items, watch events): the approver's cost grows with those, not with requests.

APPROVER_JOIN_SECONDS = 30     # from a kubelet's request to its Node registering


def legacy_approver(ref: str, folder: Path):
    """The approver of `ref` (before issue 28) and its main()'s interval and node-list period."""
    import importlib.util
    import re

    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout

    (folder / "legacy_node_approver.py").write_text(show("corral/certs/node_approver.py"))
    spec = importlib.util.spec_from_file_location("legacy_node_approver", folder / "legacy_node_approver.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # its dataclasses look their module up
    spec.loader.exec_module(module)
    manifest = show("corral/manifests/node_approver.py")
    interval = int(re.search(r"^INTERVAL_SECONDS = (\d+)", manifest, re.MULTILINE).group(1))
    label_every = int(re.search(r"^LABEL_EVERY = (\d+)", manifest, re.MULTILINE).group(1))
    return module, interval, label_every


def simulate_approver(nodes: int, hours: float, ref: str | None) -> dict:
    import os
    import random

    from corral.certs import node_approver
    from corral.manifests import node_approver as approver_addon
    from corral.manifests.policy import POOL_NODE_LABEL
    from corral.nodes.join import pool_token_group
    from tests.certs.fake_csr_apiserver import CSRS, FakeApproverCluster
    from tests.certs.test_node_approver import csr
    from tests.health.loadsim import KUBELET_REPORT_SECONDS, serve
    from tests.health.simclock import SimClock

    workdir = Path(tempfile.mkdtemp(prefix="bench-approver-"))
    jaguar = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    rng = random.Random(28)
    clock = SimClock()
    cluster = FakeApproverCluster(clock)

    def bare_node(name: str, labels: dict) -> dict:
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "spec": {}, "status": {}}

    def kubelet(name: str, at: float) -> None:
        def report() -> None:
            current = cluster.get("nodes", name)
            if current is not None:
                current["status"]["heartbeat"] = str(clock.now())
                cluster.put("nodes", current)
                kubelet(name, clock.now() + KUBELET_REPORT_SECONDS)
        clock.at(at, report)

    names = [f"node-{i:05d}" for i in range(nodes)] + [f"jaguar-apiserver-{i}" for i in range(3)]
    for name in names:
        labels = {} if name.startswith("jaguar-apiserver") else {POOL_NODE_LABEL: "gpu-h100-sf1"}
        cluster.put("nodes", bare_node(name, labels), "ADDED")
        kubelet(name, rng.uniform(0, KUBELET_REPORT_SECONDS))
    server, sa_dir = serve(cluster, workdir)
    server.httpd.RequestHandlerClass.do_PUT = server.httpd.RequestHandlerClass._handle
    os.environ.update({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port),
                       "CORRAL_SA_DIR": str(sa_dir)})
    config = approver_addon.config(jaguar)
    running = [True]
    if ref is None:
        approver = node_approver.Approver(node_approver.Api(), config, clock=clock, rng=rng)
        clock.spawn(approver.run)
    else:
        module, interval, label_every = legacy_approver(ref, workdir)
        api = module.Api()

        def loop() -> None:   # its main(): a round, then sleep(interval_seconds)
            rounds = 0
            while running:
                try:
                    module.once(api, config, label_nodes=rounds % label_every == 0)
                except (OSError, ValueError, KeyError):
                    pass
                rounds += 1
                clock.sleep(interval)
        clock.spawn(loop)
    started = time.monotonic()
    steady_start = WARMUP_SECONDS
    burst_start = steady_start + hours * 3600
    clock.run_until(burst_start)
    joining = max(1, math.ceil(SCALE_UP * nodes))
    scale_sets = [g.name for g in approver_addon.policy.autoscaler_node_groups(jaguar) if g.pool == "cpu-d64"]
    for i in range(joining):
        name = f"{scale_sets[i % len(scale_sets)]}-{i:06x}"
        at = burst_start + rng.uniform(0, BURST_SECONDS - APPROVER_JOIN_SECONDS)
        request = csr(name, [pool_token_group("cpu-d64")], name=f"csr-{i}")
        clock.at(at, lambda request=request: cluster.put(CSRS, request, "ADDED"))

        def register(name=name) -> None:
            cluster.put("nodes", bare_node(name, {}), "ADDED")
            kubelet(name, clock.now() + KUBELET_REPORT_SECONDS)
        clock.at(at + APPROVER_JOIN_SECONDS, register)
    clock.run_until(burst_start + BURST_SECONDS)
    approved = sum(1 for c in cluster.objects[CSRS].values() if (c.get("status") or {}).get("conditions"))
    labelled = sum(1 for n in cluster.objects["nodes"].values() if POOL_NODE_LABEL in n["metadata"]["labels"])
    result = {"nodes": nodes, "real_seconds": time.monotonic() - started, "steady_seconds": burst_start - steady_start,
              "requests": list(cluster.requests), "objects": list(cluster.objects_sent),
              "steady": (steady_start, burst_start), "burst": (burst_start, burst_start + BURST_SECONDS),
              "joining": joining, "approved": approved, "labelled_new": labelled - nodes}
    running.clear()
    if ref is None:
        approver.stopped = True
    server.stop()
    return result


def approver_rates(result: dict, phase: str) -> dict:
    """{(verb, resource, kind): req/s} and {("objects", resource, list|watch): objects/s} in a phase."""
    start, end = result[phase]
    seconds = end - start
    out = collections.Counter()
    for r in result["requests"]:
        if start <= r["t"] < end:
            out[(r["verb"], r["resource"], kind(r))] += 1 / seconds
    for t, resource, count, how in result["objects"]:
        if start <= t < end:
            out[("objects", resource, f"by {how}")] += count / seconds
    return out


def approver_main(sizes: list[int], hours: float, ref: str | None) -> None:
    component = "corral-node-approver" + (f" at {ref}" if ref else "")
    with contextlib.redirect_stdout(io.StringIO()):   # the approver's own log lines
        results = [simulate_approver(n, hours, ref) for n in sizes]
    for r in results:
        print(f"{component}: {r['nodes']:,} nodes simulated in {r['real_seconds']:.0f} s real time; burst: "
              f"{r['joining']} joins, {r['approved']} requests decided, {r['labelled_new']} new nodes labelled")
    burst_title = (f"Burst: +{SCALE_UP:.0%} nodes joining over {BURST_SECONDS // 60} min ({component}), "
                   "per second averaged over the burst")
    for phase, title in (("steady", f"Steady state ({component}), per second"), ("burst", burst_title)):
        data = [approver_rates(r, phase) for r in results]
        keys = sorted(set().union(*data), key=lambda k: (k[0] == "objects", k[2] == "watch", k))
        print(f"\n{title}:")
        sizes_header = " | ".join(f"{r['nodes']:,} nodes" for r in results)
        print(f"| verb | resource | kind | {sizes_header} |")
        print("| --- | --- | --- | " + " | ".join("---:" for _ in results) + " |")
        for key in keys:
            print(f"| {' | '.join(key)} | " + " | ".join(f"{d.get(key, 0):.4f}" for d in data) + " |")
        totals = [sum(v for k, v in d.items() if k[0] not in ("objects", "watch")) for d in data]
        print("| **all but watches** | | | " + " | ".join(f"**{t:.4f}**" for t in totals) + " |")


if __name__ == "__main__":
    if "--component" in sys.argv:
        parser = argparse.ArgumentParser(description="corral-node-approver's API reads at each cluster size")
        parser.add_argument("--component", choices=["node-approver"], required=True)
        parser.add_argument("--nodes", type=int, nargs="+", default=[1_000, 7_500])
        parser.add_argument("--hours", type=float, default=1.0)
        parser.add_argument("--approver-ref", help="git commit whose corral/certs/node_approver.py to measure")
        arguments = parser.parse_args()
        approver_main(arguments.nodes, arguments.hours, arguments.approver_ref)
    else:
        main()
