"""TEST FAKE: a simulated GPU cluster for the health agent's API load.

N nodes, each with its own real agent (corral/health/agent.py, loaded as the
pod loads it) talking HTTPS to one fake API server (fake_apiserver.py), all
in simulated time (simclock.py). The cluster around them is simulated too:

- each kubelet posts its node's status every 5 minutes
  (nodeStatusReportFrequency's default; kubelet config v1beta1 defaults.go),
  which the node watch sees;
- a GPU job lands on or leaves each node about every 20 minutes (pods);
- faults: an Xid line in a node's kernel log (the agent's own file);
- a reboot: a new boot id, the preflight's verdict of the new boot, the
  agent's pod restarted (its watches end, a new agent lists again);
- a scale-up: new nodes registered behind the preflight taint, their agents
  started over a window (cloud machines boot over minutes, not at once).

The node's host is faked at the process boundary: nvidia-smi answers from
memory (FAKE_nvidia_smi) rather than a program, so thousands of rounds run
in seconds; the agent's own kernel log, boot id, verdict and state files
are real files, one folder per node.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import random
import secrets
import sys
import types
from pathlib import Path

from .fake_apiserver import FakeCluster, FakeServer
from .simclock import SimClock

H100 = "NVIDIA H100 80GB HBM3"
POOL = "gpu-h100-sf1"
KUBELET_REPORT_SECONDS = 300
POD_CHURN_SECONDS = 1200
LEGACY_BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def FAKE_nvidia_smi(argv: list[str]) -> str | None:  # noqa: N802  (named as the fake it is)
    """The agent's `run` for nvidia-smi: eight healthy H100s."""
    if argv[:1] != ["nvidia-smi"]:
        return None
    if "--query-gpu=index,name" in argv:
        return "".join(f"{i}, {H100}\n" for i in range(8))
    if any(a.startswith("--query-gpu=") for a in argv):
        return "".join(f"{i}, 0, No, No, No\n" for i in range(8))
    return ""   # nvlink -s: no link listed inactive


def load_agent(source_dir: Path, name: str = "corral_health_agent_sim") -> types.ModuleType:
    """agent.py as the pod runs it (beside classify.py), from `source_dir`."""
    spec = importlib.util.spec_from_file_location(name, source_dir / "agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop("classify", None)
    module.run = FAKE_nvidia_smi
    return module


def serve(cluster: FakeCluster, workdir: Path) -> tuple[FakeServer, Path]:
    """The fake API server over HTTPS for `cluster`, and a service account folder
    (token, CA) as the agent's pod has it mounted."""
    token = secrets.token_hex(8)
    server = FakeServer(cluster, "127.0.0.1", token, workdir).start()
    sa_dir = workdir / "serviceaccount"
    sa_dir.mkdir(parents=True, exist_ok=True)
    (sa_dir / "token").write_text(token)
    (sa_dir / "ca.crt").write_bytes(server.ca.read_bytes())
    return server, sa_dir


def gpu_node(name: str, *, pending: bool = False) -> dict:
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    if pending:
        taints.append({"key": "corral.dev/preflight", "value": "pending", "effect": "NoSchedule"})
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"corral.dev/pool": POOL}},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": "0"}]}}


class SimulatedCluster:
    def __init__(self, agent: types.ModuleType, config: dict, workdir: Path, *, seed: int = 1,
                 legacy: bool = False, pod_churn: bool = True) -> None:
        self.agent_module, self.legacy, self.pod_churn = agent, legacy, pod_churn
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.cluster = FakeCluster(self.clock)
        self.workdir = workdir
        self.server, self.sa_dir = serve(self.cluster, workdir)
        config = copy.deepcopy(config)
        config["pools"] = {POOL: dict(config["pools"][POOL], roce_interfaces=[], run_preflight=False,
                                      preflight_script=None)}
        config["host_command"] = [str(workdir / "FAKE-no-host-programs")]   # dcgmi, nccl: not installed
        self.config = config
        self.agents: dict[str, object] = {}
        self.boots: dict[str, int] = {}
        self.pods_of: dict[str, int] = {}

    # -- nodes ---------------------------------------------------------------------------

    def node_dir(self, name: str) -> Path:
        return self.workdir / "nodes" / name

    def boot(self, name: str, verdict: bool = True) -> None:
        """A (re)boot: a new boot id, and the preflight unit's verdict of it."""
        folder = self.node_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        self.boots[name] = self.boots.get(name, 0) + 1
        # The agent before issue 28 read the machine's own boot id, not a file of the configuration.
        boot_id = LEGACY_BOOT_ID if self.legacy else f"{name}-boot-{self.boots[name]}"
        (folder / "boot_id").write_text(boot_id + "\n")
        (folder / "kmsg").write_text("")
        if verdict:
            (folder / "preflight.json").write_text(json.dumps(
                {"passed": True, "reason": "AllChecksPassed", "message": "8 x H100", "boot_id": boot_id}))

    def add_node(self, name: str, *, pending: bool = False, checked_ago: float | None = None) -> None:
        """Register a node; `checked_ago`: its last active check that long ago (a cluster already running)."""
        self.boot(name)
        self.cluster.put("nodes", gpu_node(name, pending=pending))
        if checked_ago is not None:
            state = {"boot_id": (self.node_dir(name) / "boot_id").read_text().strip(), "last_run": self.clock.time() - checked_ago,
                     "faults": []}
            (self.node_dir(name) / "active.json").write_text(json.dumps(state))
        phase = self.rng.uniform(0, KUBELET_REPORT_SECONDS)
        self.clock.at(self.clock.now() + phase, lambda: self._kubelet_report(name))
        if self.pod_churn:
            self.clock.at(self.clock.now() + self.rng.expovariate(1 / POD_CHURN_SECONDS),
                          lambda: self._pod_churn(name))

    def node_config(self, name: str) -> dict:
        folder = self.node_dir(name)
        return dict(self.config, verdict_path=str(folder / "preflight.json"), kernel_log=str(folder / "kmsg"),
                    boot_id_path=str(folder / "boot_id"))

    def start_agent(self, name: str) -> None:
        module, config = self.agent_module, self.node_config(name)
        if self.legacy:
            # Its Api took the address from the environment and the token from a fixed folder.
            module.SA_DIR = str(self.sa_dir)
            os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"] = "127.0.0.1", str(
                self.server.port)
            api = module.Api()

            def loop() -> None:   # the agent's main() before issue 28: a round, then sleep
                while name in self.agents:
                    try:
                        module.once(api, config, name)
                    except (OSError, ValueError, KeyError):
                        pass
                    self.clock.sleep(config["interval_seconds"])
            self.agents[name] = loop
            self.clock.spawn(loop)
            return
        api = module.Api(base=self.server.url, sa_dir=str(self.sa_dir), user_agent=f"corral-gpu-health/{name}")
        agent = module.Agent(api, config, name, clock=self.clock, rng=random.Random(self.rng.random()))
        self.agents[name] = agent
        self.clock.spawn(agent.run)

    def stop_agent(self, name: str) -> None:
        agent = self.agents.pop(name)
        if not self.legacy:
            agent.stop()
        self.cluster.disconnect(name)

    # -- what happens to nodes -------------------------------------------------------------

    def _kubelet_report(self, name: str) -> None:
        node = self.cluster.get("nodes", name)
        if node is not None:
            for condition in node["status"]["conditions"]:
                if condition["type"] == "Ready":
                    condition["lastHeartbeatTime"] = str(self.clock.now())
            self.cluster.put("nodes", node)
        self.clock.at(self.clock.now() + KUBELET_REPORT_SECONDS, lambda: self._kubelet_report(name))

    def _pod_churn(self, name: str) -> None:
        count = self.pods_of.get(name, 0)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ml", "name": f"{name}-job-{count}"},
               "spec": {"nodeName": name, "containers": [{"name": "train", "resources": {
                   "limits": {"nvidia.com/gpu": 8}}}]}, "status": {"phase": "Running"}}
        running = self.cluster.get("pods", f"ml/{name}-job-{count}")
        if running:
            self.cluster.put("pods", running, "DELETED")
            self.pods_of[name] = count + 1
        else:
            self.cluster.put("pods", pod, "ADDED")
        self.clock.at(self.clock.now() + self.rng.expovariate(1 / POD_CHURN_SECONDS), lambda: self._pod_churn(name))

    def fault(self, name: str) -> None:
        """Xid 79 (fallen off the bus) in the node's kernel log."""
        with open(self.node_dir(name) / "kmsg", "a") as fh:
            fh.write("4,1234,5678,-;NVRM: Xid (PCI:0000:2b:00): 79, pid=2213, GPU has fallen off the bus.\n")

    def reboot(self, name: str) -> None:
        self.stop_agent(name)
        self.boot(name)
        self.start_agent(name)

    # -- the run -------------------------------------------------------------------------

    def run_until(self, t: float) -> None:
        self.clock.run_until(t)

    def requests(self, start: float, end: float) -> list[dict]:
        return [r for r in self.cluster.requests if start <= r["t"] < end]

    def stop(self) -> None:
        for name in list(self.agents):
            self.agents.pop(name)
        self.clock.stop()
        self.server.stop()
