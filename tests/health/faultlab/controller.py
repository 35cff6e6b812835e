"""The repair controller (corral/health/repair/, issue 27 item 2) in the fault lab's process, on the lab's
simulated clock, talking HTTPS to the lab's fake API server as its pod would.

`missing_pieces()` names what the suite needs and the tree does not have yet (the controller, the agent's
side of repair): the cases that need it are expected failures naming it, never a fake success.
"""

from __future__ import annotations

import functools
import importlib.util
import random
import sys
from pathlib import Path

from corral.health import addon
from corral.health import repair_protocol as protocol

ROOT = Path(__file__).resolve().parents[3]
REPLICAS = 2          # as the add-on runs it: two replicas, one leading through the Lease
# The modules the controller's ConfigMap folder holds side by side (it imports them as top-level ones).
POD_MODULES = ("controller", "decide", "agent", "classify", "repair_protocol")


def missing_pieces() -> list[str]:
    """What the closed loop needs that is not in the tree."""
    missing = []
    if importlib.util.find_spec("corral.health.repair.controller") is None:
        missing.append("corral/health/repair/controller.py (H4: the repair controller that cordons, drains and "
                       "writes corral.dev/repair)")
    agent_source = (addon.HERE / "agent.py").read_text()
    if protocol.REPAIR_ANNOTATION not in agent_source and "REPAIR_ANNOTATION" not in agent_source:
        missing.append("corral/health/agent.py carrying out corral.dev/repair (H5: reset, reboot, burn-in, "
                       "corral.dev/repair-status and corral.dev/burn-in)")
    return missing


def controller_config(auto_repair: dict, cluster=None) -> dict:
    """config.json as corral/manifests/repair.py renders it from the cluster file (the lab's, jaguar,
    unless another is given), with these `health.autoRepair` settings (camelCase, as a cluster file
    writes them) validated by the model."""
    from corral.manifests import repair
    from corral.model.auto_repair import AutoRepair

    cluster = cluster or lab_cluster()
    settings = AutoRepair.model_validate({**cluster.health.auto_repair.model_dump(by_alias=True), **auto_repair})
    cluster = cluster.model_copy(update={"health": cluster.health.model_copy(update={"auto_repair": settings})})
    return repair.config(cluster)


def load_controller_module(folder: Path):
    """controller.py from a folder laid out as its pod's ConfigMap is (corral/manifests/repair.py files())."""
    from corral.manifests import repair

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in repair.files(lab_cluster()).items():
        if name != "config.json":       # the lab passes the case's configuration itself
            (folder / name).write_text(text)
    saved = {m: sys.modules.pop(m) for m in POD_MODULES if m in sys.modules}
    try:
        spec = importlib.util.spec_from_file_location(f"corral_repair_faultlab_{random.randrange(1 << 30)}",
                                                      folder / "controller.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for m in POD_MODULES:
            sys.modules.pop(m, None)
        sys.modules.update(saved)
    return module


@functools.cache
def lab_cluster():
    from corral.model.loader import load_cluster

    return load_cluster(ROOT / "clusters" / "jaguar.yaml")


class Replicas:
    """The controller's replicas, each with its own API client (as each pod has), on `clock`."""

    def __init__(self, module, config: dict, base_url: str, sa_dir: Path, clock, replicas: int = REPLICAS) -> None:
        self.module, self.config, self.base_url, self.sa_dir, self.clock = module, config, base_url, sa_dir, clock
        self.replicas = replicas
        self.controllers = []

    def start(self) -> None:
        for i in range(self.replicas):
            identity = f"corral-repair-faultlab-{i}"
            api = self.module.agent.Api(base=self.base_url, sa_dir=str(self.sa_dir),
                                        user_agent=f"corral-repair/{identity}")
            # replace=None: the lab's pools are on-prem, where nothing is replaced.
            controller = self.module.Controller(api, self.config, identity, clock=self.clock,
                                                rng=random.Random(i), replace=None)
            self.controllers.append(controller)
            self.clock.spawn(controller.run)

    def stop(self) -> None:
        for controller in self.controllers:
            controller.stop()


def empty_stores(cluster, config: dict) -> None:
    """The two ConfigMaps the add-on renders empty for the controller (history, status), in the fake
    API server's objects, unless there already."""
    for name in (protocol.HISTORY_CONFIGMAP, config["status_configmap"]):
        if cluster.get("configmaps", f"{config['namespace']}/{name}") is None:
            cluster.put("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"namespace": config["namespace"], "name": name}, "data": {}},
                        "ADDED")


def attach_controller(lab, case, replicas: int = REPLICAS) -> None:
    """Give the lab the repair controller for this case (started by lab.start())."""
    config = controller_config(case.auto_repair)
    empty_stores(lab.cluster, config)
    module = load_controller_module(lab.workdir / "controller")
    lab.controller = Replicas(module, config, lab.server.url, lab.sa_dir, lab.clock, replicas)
