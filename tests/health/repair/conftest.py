"""Fixtures of the repair controller's tests: its code loaded the way its pod runs it (the
ConfigMap's files side by side in one folder), and a simulated cluster around it: the recording
fake API server (tests/health/fake_apiserver.py) in simulated time (tests/health/simclock.py)."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import types
from datetime import UTC
from pathlib import Path

import pytest

from corral.manifests import repair as repair_addon
from tests.health.conftest import cluster
from tests.health.fake_apiserver import FakeCluster
from tests.health.loadsim import serve
from tests.health.simclock import WALL_START, SimClock

SHIPPED_MODULES = ("agent", "classify", "decide", "repair_protocol", "cloud_api")


def load_shipped(folder: Path, files: dict[str, str], name: str) -> types.ModuleType:
    """controller.py from `folder`, written as the ConfigMap mounts it; its neighbours import as it does."""
    folder.mkdir(parents=True, exist_ok=True)
    for file, text in files.items():
        (folder / file).write_text(text)
    for module in SHIPPED_MODULES:
        sys.modules.pop(module, None)
    spec = importlib.util.spec_from_file_location(name, folder / "controller.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The controller module as shipped for jaguar (on-prem GPU pools); .decide is its decide.py."""
    module = load_shipped(tmp_path_factory.mktemp("repair-code"), repair_addon.files(cluster("jaguar")),
                          "corral_repair_controller")
    yield module
    for name in SHIPPED_MODULES:
        sys.modules.pop(name, None)


def stamp_at(seconds: float) -> str:
    """The RFC 3339 time of simulated second `seconds`."""
    from datetime import datetime

    return datetime.fromtimestamp(WALL_START + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


XID48 = ("GPUXidFault", "Xid48", "Xid 48 on 0000:17:00.0: DBE (Double Bit ECC Error)")
XID79 = ("GPUXidFault", "Xid79", "Xid 79 on 0000:17:00.0: GPU has fallen off the bus")


def make_node(name: str, pool: str, labels: dict | None = None, provider_id: str = "") -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"corral.dev/pool": pool, **(labels or {})}, "annotations": {}},
            "spec": {"taints": [], **({"providerID": provider_id} if provider_id else {})},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


class Sim:
    """A cluster of GPU nodes, its fake API server, and repair controllers, in simulated time.

    The node agents are faked at the API boundary (FAKE_agent_*): they write the taints and
    annotations the real agent writes (corral/health/repair_protocol.py), on cue."""

    def __init__(self, module: types.ModuleType, workdir: Path, config: dict) -> None:
        self.module, self.config = module, config
        self.clock = SimClock()
        self.cluster = FakeCluster(self.clock, history_seconds=1e9)
        workdir.mkdir(parents=True, exist_ok=True)
        self.server, self.sa_dir = serve(self.cluster, workdir)
        self.controllers: list = []
        for name in (config["status_configmap"], "corral-repair-history"):
            self.cluster.put("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": name, "namespace": config["namespace"]}})

    def add_controller(self, identity: str, replace=None):
        api = self.module.agent.Api(base=self.server.url, sa_dir=str(self.sa_dir),
                                    user_agent=f"corral-repair/{identity}")
        controller = self.module.Controller(api, self.config, identity, clock=self.clock,
                                            rng=random.Random(identity), replace=replace)
        self.controllers.append(controller)
        self.clock.spawn(controller.run)
        return controller

    def add_node(self, node: dict) -> None:
        self.cluster.put("nodes", node)

    def node(self, name: str) -> dict:
        return self.cluster.get("nodes", name)

    def annotation(self, name: str, key: str):
        value = (self.node(name)["metadata"].get("annotations") or {}).get(key)
        return json.loads(value) if value and value.startswith("{") else value

    def change(self, name: str, edit) -> None:
        node = self.node(name)
        edit(node)
        self.cluster.put("nodes", node)

    def at(self, when: float, callback) -> None:
        self.clock.at(when, callback)

    def run_until(self, seconds: float) -> None:
        self.clock.run_until(seconds)

    def stop(self) -> None:
        for controller in self.controllers:
            controller.stop()
        self.clock.stop()
        self.server.stop()

    # -- the node agent, faked at the API boundary ---------------------------------------------

    def FAKE_agent_taint(self, name: str, fault=XID48, since: float | None = None) -> None:
        condition, reason, message = fault
        when = stamp_at(self.clock.now() if since is None else since)

        def edit(node):
            node["spec"]["taints"] = [t for t in node["spec"].get("taints") or []
                                      if t["key"] != "corral.dev/unhealthy"] + [
                {"key": "corral.dev/unhealthy", "value": condition, "effect": "NoExecute", "timeAdded": when}]
            node["status"]["conditions"] = [c for c in node["status"]["conditions"] if c["type"] != condition] + [
                {"type": condition, "status": "True", "reason": reason, "message": message}]
        self.change(name, edit)

    def FAKE_agent_report(self, name: str, state: str, burn_in: str | None = None,
                          burn_in_id: str | None = None) -> None:
        """The agent's answer to the node's current repair: its status and (optionally) its burn-in;
        a passed burn-in lifts both taints, as the agent does."""
        repair = self.annotation(name, "corral.dev/repair")
        at = stamp_at(self.clock.now())

        def edit(node):
            notes = node["metadata"].setdefault("annotations", {})
            notes["corral.dev/repair-status"] = json.dumps({"id": repair["id"], "state": state, "detail": "fake",
                                                            "at": at})
            if burn_in:
                notes["corral.dev/burn-in"] = json.dumps({"id": burn_in_id or repair["id"], "result": burn_in,
                                                          "detail": "fake burn-in", "at": at})
            if burn_in == "passed":
                node["spec"]["taints"] = [t for t in node["spec"]["taints"]
                                          if t["key"] not in ("corral.dev/unhealthy", "corral.dev/burn-in")]
                node["status"]["conditions"] = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
            elif burn_in == "failed":
                node["spec"]["taints"] = node["spec"]["taints"] + [
                    {"key": "corral.dev/burn-in", "value": "failed", "effect": "NoSchedule"}]
        self.change(name, edit)

    def requests(self, **match) -> list[dict]:
        return [r for r in self.cluster.requests if all(r.get(k) == v for k, v in match.items())]

    def events(self, reason: str) -> list[dict]:
        return [e for e in self.cluster.objects["events"].values() if e.get("reason") == reason]


def sim_config(name: str = "jaguar", **overrides) -> dict:
    config = repair_addon.config(cluster(name))
    for key, value in overrides.items():
        config[key] = value
    return config


@pytest.fixture
def sim(shipped, tmp_path):
    made: list[Sim] = []

    def make(config: dict | None = None) -> Sim:
        made.append(Sim(shipped, tmp_path / f"sim{len(made)}", config or sim_config()))
        return made[-1]

    yield make
    for one in made:
        one.stop()
