"""TEST FAKE: the fault-injection lab (issue 27, item 5): a pool of simulated GPU nodes in simulated time.

Real code: every node's health agent (corral/health/agent.py, loaded as its pod loads it, one module per
node) and the repair controller (corral/health/repair/, in this process: controller.py). Faked, at the
network and process boundary: the Kubernetes API (the recording fake API server, fake_apiserver.py, over
HTTPS), each node's hardware (host.py), the kubelet's part (pods bound to nodes; a reboot restarts the
agent's pod). Time is simulated (simclock.py): hours of the loop run in seconds.

The lab watches every node write (RecordingCluster) and keeps, per node, when each step of the loop
happened (tainted, cordoned, repair requested, repair done, burn-in result, uncordoned) and whether the
node went back into service while its hardware was still broken: a false readmission.
"""

from __future__ import annotations

import copy
import json
import random
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from corral.health import addon
from corral.health import repair_protocol as protocol

from ..fake_apiserver import FakeCluster, FakeServer, make_ca_and_cert
from ..loadsim import POOL, gpu_node, load_agent, serve
from ..simclock import SimClock
from .host import REBOOT_SECONDS, FAKE_kmsg_follower, SimulatedGpuHost

UNHEALTHY = "corral.dev/unhealthy"


def _annotation(node: dict, key: str) -> dict | None:
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(key)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return {"unparsable": text}


def in_service(node: dict) -> bool:
    """Schedulable: not cordoned, and no corral.dev/ taint that keeps pods away."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return not any(t.get("key", "").startswith("corral.dev/") and t.get("effect") in ("NoSchedule", "NoExecute")
                   for t in (node.get("spec") or {}).get("taints") or [])


@dataclass
class Timeline:
    """When each step of the loop happened to one node (simulated seconds), from its writes."""
    injected: float | None = None
    tainted: float | None = None
    cordoned: float | None = None
    repairs: list[dict] = field(default_factory=list)      # each corral.dev/repair written: {t, id, action}
    statuses: list[dict] = field(default_factory=list)     # corral.dev/repair-status changes: {t, id, state}
    burn_ins: list[dict] = field(default_factory=list)     # corral.dev/burn-in changes: {t, id, result}
    returns: list[float] = field(default_factory=list)     # every return to service (the agent's own too)
    readmitted: float | None = None                        # back in service after a passed burn-in
    false_readmissions: list[float] = field(default_factory=list)
    out_since: float | None = None                          # out of service since (cordoned or tainted)

    def actions(self) -> list[str]:
        return [r["action"] for r in self.repairs]


class RecordingCluster(FakeCluster):
    """The fake API server's objects, with each node write looked at as it is stored."""

    def __init__(self, lab: FaultLab, clock) -> None:
        super().__init__(clock)
        self.lab = lab

    def commit(self, resource: str, obj: dict, kind: str = "MODIFIED") -> dict:
        stored = super().commit(resource, obj, kind)
        if resource == "nodes" and kind != "DELETED":
            self.lab.observe_node(stored)
        if resource == "pods" and kind == "DELETED":
            self.lab.pod_gone(stored)
        return stored


class FaultLab:
    """A pool of simulated GPU nodes, their agents, the repair controller, and what happened to each."""

    def __init__(self, workdir: Path, *, nodes: int = 10, rack_size: int | None = 5, nvlink: bool = True,
                 burn_in: dict | None = None, jobs: bool = True, tls: bool = True) -> None:
        from .controller import lab_cluster

        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.clock = SimClock()
        self.cluster = RecordingCluster(self, self.clock)
        self.server, self.sa_dir = serve(self.cluster, workdir) if tls else self._serve_plain(workdir)
        config = copy.deepcopy(addon.agent_config(lab_cluster()))
        pool = dict(config["pools"][POOL], run_preflight=False, preflight_script=None, nvlink=nvlink)
        self.config = dict(config, pools={POOL: pool}, active=dict(config["active"], enabled=False))
        self.burn_in = burn_in or {}
        self.pool_name = POOL
        self.hosts: dict[str, SimulatedGpuHost] = {}
        self.agents: dict[str, object] = {}
        self.modules: dict[str, object] = {}
        self.timelines: dict[str, Timeline] = {}
        self.controller = None
        self.out_now: set[str] = set()      # nodes cordoned now
        self.out_max = 0
        for i in range(nodes):
            name = f"gpu-{i + 1:03d}"
            rack = f"sf1-r{i // rack_size + 1:02d}" if rack_size else None
            self.hosts[name] = SimulatedGpuHost(self, name, workdir / "nodes" / name, rack=rack)
            self.timelines[name] = Timeline()
            node = gpu_node(name)
            if rack:
                node["metadata"]["labels"][protocol.RACK_LABEL] = rack
            self.cluster.put("nodes", node)
            if jobs:
                self.start_job(name)

    def _serve_plain(self, workdir: Path):
        """The fake API server over plain HTTP: the fast tier's choice (each of the controller's lease
        renewals every 2 s would otherwise be a TLS handshake; HTTPS itself is tested by detectlab's
        and the hostlab's runs). The service account folder still holds a token and a CA, as a pod's does."""
        token = secrets.token_hex(8)
        server = FakeServer(self.cluster, "127.0.0.1", token, None).start()
        sa_dir = workdir / "serviceaccount"
        sa_dir.mkdir(parents=True, exist_ok=True)
        (sa_dir / "token").write_text(token)
        ca, _, _ = make_ca_and_cert(workdir, "127.0.0.1")
        (sa_dir / "ca.crt").write_bytes(ca.read_bytes())
        return server, sa_dir

    # -- the kubelet's part --------------------------------------------------------------------

    def start_job(self, name: str) -> None:
        """A training job's pod on the node, holding its eight GPUs (until the pod is gone)."""
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"namespace": "ml", "name": f"{name}-train", "labels": {"app": "train"}},
               "spec": {"nodeName": name, "containers": [{"name": "train", "resources": {
                   "limits": {"nvidia.com/gpu": 8}}}]}, "status": {"phase": "Running"}}
        self.cluster.put("pods", pod, "ADDED")
        self.hosts[name].state.gpu_processes = list(range(8))

    def pod_gone(self, pod: dict) -> None:
        """An evicted or deleted pod's processes end: its GPUs are free."""
        host = self.hosts.get((pod.get("spec") or {}).get("nodeName", ""))
        if host is not None:
            host.state.gpu_processes = []

    # -- agents ------------------------------------------------------------------------------

    def node_config(self, host: SimulatedGpuHost) -> dict:
        return dict(self.config, verdict_path=str(host.folder / "preflight.json"),
                    kernel_log=str(host.folder / "FAKE_kmsg"), boot_id_path=str(host.folder / "boot_id"),
                    infiniband_sysfs=str(host.sysfs), burn_in={**(self.config.get("burn_in") or {}), **self.burn_in})

    def start_agent(self, name: str) -> None:
        host = self.hosts[name]
        module = self.modules.get(name)
        if module is None:
            module = load_agent(addon.HERE, name=f"corral_health_agent_faultlab_{name}_{random.randrange(1 << 30)}")
            module.run = host.FAKE_nvidia_smi
            module.run_on_host = host.FAKE_host_command
            module.followable = lambda path: True
            classify = module.classify
            module.KernelLogFollower = lambda path, deliver, stopped: FAKE_kmsg_follower(
                host, classify, deliver, stopped)
            self.modules[name] = module
        api = module.Api(base=self.server.url, sa_dir=str(self.sa_dir), user_agent=f"corral-gpu-health/{name}")
        agent = module.Agent(api, self.node_config(host), name, clock=self.clock,
                             rng=random.Random(int(name[-3:])))
        self.agents[name] = agent
        self.clock.spawn(agent.run)

    def stop_agent(self, name: str) -> None:
        agent = self.agents.pop(name, None)
        if agent is not None:
            agent.stop()
        self.hosts[name].follower = None
        self.cluster.disconnect(name)

    def reboot_later(self, host: SimulatedGpuHost) -> None:
        """The host reboots itself (the agent asked): its agent's pod goes now, the host and a new agent
        come back REBOOT_SECONDS later (a bare-metal server's firmware, kernel, kubelet)."""
        host.reboots += 1
        self.clock.at(self.clock.now() + 1.0, lambda: self.stop_agent(host.name))
        self.clock.at(self.clock.now() + REBOOT_SECONDS, lambda: (host.boot(), self.start_agent(host.name)))

    # -- what happened ----------------------------------------------------------------------------

    def observe_node(self, node: dict) -> None:
        """Called with the lock held, for each stored node version: note the loop's steps."""
        name = node["metadata"]["name"]
        timeline, host, now = self.timelines.get(name), self.hosts.get(name), self.clock.now()
        if timeline is None:
            return
        if (node.get("spec") or {}).get("unschedulable"):
            self.out_now.add(name)
            self.out_max = max(self.out_max, len(self.out_now))
        else:
            self.out_now.discard(name)
        if timeline.injected is None:
            return
        taints = {t.get("key"): t for t in (node.get("spec") or {}).get("taints") or []}
        if timeline.tainted is None and UNHEALTHY in taints:
            timeline.tainted = now
        if timeline.cordoned is None and (node.get("spec") or {}).get("unschedulable"):
            timeline.cordoned = now
        repair = _annotation(node, protocol.REPAIR_ANNOTATION)
        if repair and (not timeline.repairs or timeline.repairs[-1]["id"] != repair.get("id")):
            timeline.repairs.append({"t": now, "id": repair.get("id"), "action": repair.get("action")})
        status = _annotation(node, protocol.REPAIR_STATUS_ANNOTATION)
        if status and (not timeline.statuses or (timeline.statuses[-1]["id"], timeline.statuses[-1]["state"]) != (
                status.get("id"), status.get("state"))):
            timeline.statuses.append({"t": now, "id": status.get("id"), "state": status.get("state")})
        burn_in = _annotation(node, protocol.BURN_IN_ANNOTATION)
        if burn_in and (not timeline.burn_ins or (timeline.burn_ins[-1]["id"], timeline.burn_ins[-1]["result"]) != (
                burn_in.get("id"), burn_in.get("result"))):
            timeline.burn_ins.append({"t": now, "id": burn_in.get("id"), "result": burn_in.get("result"),
                                      "detail": burn_in.get("detail")})
        serving = in_service(node)
        if not serving and timeline.out_since is None:
            timeline.out_since = now
        if serving and timeline.out_since is not None:
            timeline.out_since = None
            timeline.returns.append(now)
            if host is not None and host.broken:
                timeline.false_readmissions.append(now)
            elif timeline.readmitted is None and any(b["result"] == "passed" for b in timeline.burn_ins):
                timeline.readmitted = now

    def inject(self, name: str, kind: str, *, broken: bool = False) -> None:
        """The fault now (call from a clock callback or before the run)."""
        timeline = self.timelines[name]
        if timeline.injected is None:
            timeline.injected = self.clock.now()
        self.hosts[name].inject(kind, broken=broken)

    def inject_at(self, when: float, name: str, kind: str, *, broken: bool = False) -> None:
        self.clock.at(when, lambda: self.inject(name, kind, broken=broken))

    def put_configmap(self, namespace: str, name: str, data: dict) -> None:
        self.cluster.objects.setdefault("configmaps", {})
        self.cluster.put("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                        "metadata": {"namespace": namespace, "name": name}, "data": data}, "ADDED")

    def node(self, name: str) -> dict:
        return self.cluster.get("nodes", name)

    def events(self) -> list[dict]:
        with self.cluster.lock:
            return [json.loads(json.dumps(e)) for e in self.cluster.objects["events"].values()]

    # -- the run ----------------------------------------------------------------------------------

    def start(self) -> None:
        for name in self.hosts:
            self.start_agent(name)
        if self.controller is not None:
            self.controller.start()

    def run_until(self, t: float, done=None, step: float = 30.0) -> float:
        """Advance simulated time to `t`, or until done() holds (looked at every `step`); the time reached."""
        while self.clock.now() < t:
            self.clock.run_until(min(t, self.clock.now() + step), real_timeout=60)
            if done is not None and done():
                break
        return self.clock.now()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
        for name in list(self.agents):
            agent = self.agents.pop(name)
            agent.stop()
        self.clock.stop()
        self.server.stop()
