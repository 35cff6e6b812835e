"""`corral upgrade` end to end on throwaway hosts (systemd-nspawn, tests/hostlab).

Four hosts (three CPU, one GPU) are joined at Kubernetes 1.31.4 / driver
550.127.05 with `corral join`, then the cluster file moves to 1.32.0 / driver
550.144.03 and `corral upgrade` rolls them through the real CLI,
ansible-runner and playbooks/upgrade.yml. The lab's apt repository carries
both versions of the fake packages. The API server is the fake kubectl
(tests/upgrade/fake_kubectl): it records every cordon/drain/uncordon, refuses a
drain that would break a PodDisruptionBudget, reports each node's kubelet
version from what the host's fake kubelet runs, and holds the playbook's
calls to the node runner's RBAC rules.

The runs, in order (one module-scoped lab; each test checks one run):
  check     --check prints the order and changes nothing
  budget    a PDB refuses the drain of cpu-002 in batch 1 with no failure
            budget: cpu-001 upgraded, cpu-002 uncordoned unchanged, batch 2
            never touched, exit 1
  broken    the PDB is gone, kubeadm upgrade node fails on the GPU host:
            batch [cpu-002, cpu-003] done, the GPU host left cordoned
            (interrupted mid-host), exit 1
  resume    the failure is gone: only the GPU host is worked on, finished
  again     a second run changes nothing and cordons nothing
  driver    the GPU pool's driver moves again and a new GPU host is added:
            `corral join` drains the serving GPU node before its driver
            changes and uncordons it after; the new host (not a node yet)
            takes the fast path, nothing drained; a second join (--force: the
            roles run everywhere) drains nothing
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("testinfra")
import testinfra  # noqa: E402

from tests.hostlab.aptrepo import AptRepo  # noqa: E402
from tests.hostlab.lab import Lab, LabConfig, available  # noqa: E402
from corral.model import load_cluster  # noqa: E402
from corral.nodes.known_hosts import trust as trust_host_keys  # noqa: E402
from tests.nodes import joinlab  # noqa: E402

pytestmark = pytest.mark.hostlab

GPU_HOSTS, CPU_HOSTS = joinlab.host_names(gpu=1, cpu=3, prefix="upg")
ALL_HOSTS = sorted(GPU_HOSTS + CPU_HOSTS)
# Booted with the others, but in no cluster file until the driver test adds it.
LATE_GPU = joinlab.host_names(gpu=2, cpu=0, prefix="upg")[0][1]
OLD, NEW = "1.31.4", "1.32.0"
OLD_DRIVER, NEW_DRIVER, JOIN_DRIVER = "550.127.05", "550.144.03", "550.163.01"
FAKE_KUBECTL = Path(__file__).with_name("fake_kubectl")


def short(host: str) -> str:
    return host.split(".")[0]


CPU1, CPU2, CPU3 = (short(h) for h in CPU_HOSTS)
GPU1 = short(GPU_HOSTS[0])


def initial_state(hosts) -> dict:
    """The fake API server: nodes backed by the lab hosts, pods and PDBs on them."""
    return {
        "serverVersion": f"v{NEW}",
        "nodes": {short(h.name): {"root": str(h.path("/")), "annotations": {}} for h in hosts},
        "pods": [
            {"name": "web-1", "namespace": "shop", "node": CPU1, "labels": {"app": "web"}},
            {"name": "web-2", "namespace": "shop", "node": CPU3, "labels": {"app": "web"}},
            # The only replica of a database whose budget allows no disruption.
            {"name": "db-0", "namespace": "shop", "node": CPU2, "labels": {"app": "db"}},
            *({"name": f"flannel-{short(h.name)}", "namespace": "kube-flannel", "node": short(h.name),
               "labels": {"app": "flannel"}, "daemonset": True} for h in hosts),
        ],
        "pdbs": [
            {"name": "web", "namespace": "shop", "selector": {"app": "web"}, "minAvailable": 1},
            {"name": "db", "namespace": "shop", "selector": {"app": "db"}, "minAvailable": 1},
        ],
    }


class Upgrade:
    """The lab, the setup and a log of fake-kubectl calls per run."""

    def __init__(self, lab, hosts, setup, workdir: Path):
        self.lab, self.hosts, self.setup, self.workdir = lab, {h.name: h for h in hosts}, setup, workdir
        self.state_path = workdir / "kube-state.json"
        self.log = workdir / "upgrade-kubectl.jsonl"
        self.fake_bin = workdir / "upgrade-bin"
        self.fake_bin.mkdir()
        (self.fake_bin / "kubectl").symlink_to(FAKE_KUBECTL)
        self.clusters = workdir / "clusters-upgraded"
        self.clusters.mkdir()
        text = (setup.clusters / f"{joinlab.CLUSTER}.yaml").read_text()
        assert f'version: "{OLD}"' in text and f'driver: "{OLD_DRIVER}"' in text
        (self.clusters / f"{joinlab.CLUSTER}.yaml").write_text(
            text.replace(f'version: "{OLD}"', f'version: "{NEW}"').replace(OLD_DRIVER, NEW_DRIVER))
        # The hosts' recorded ssh keys go with the cluster file.
        shutil.copy(setup.clusters / f"{joinlab.CLUSTER}.known_hosts", self.clusters)
        site = json.loads(setup.extra_vars.read_text())
        site["corral_kubernetes_repo_url"] = site["corral_kubernetes_repo_url"].replace("v1.31", "v1.32")
        self.extra_vars = workdir / "site-mirror-1.32.json"
        self.extra_vars.write_text(json.dumps(site))
        self.results: dict[str, subprocess.CompletedProcess] = {}
        self.calls: dict[str, list[dict]] = {}

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def edit_state(self, change) -> None:
        state = self.state()
        change(state)
        self.state_path.write_text(json.dumps(state))

    def run(self, label: str, *extra: str, command: str = "upgrade",
            clusters: Path | None = None) -> subprocess.CompletedProcess:
        before = len(self.log.read_text().splitlines()) if self.log.exists() else 0
        env = joinlab.env_with(self.setup)
        env.update({"PATH": f"{self.fake_bin}{os.pathsep}{os.environ['PATH']}",
                    "FAKE_KUBE_STATE": str(self.state_path), "FAKE_KUBECTL_LOG": str(self.log)})
        argv = [sys.executable, "-m", "corral", command, joinlab.CLUSTER, "--clusters", str(clusters or self.clusters),
                "--extra-vars", str(self.extra_vars), "--runs-dir", str(self.setup.runs_dir), *extra]
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        self.results[label] = result
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.calls[label] = [json.loads(line) for line in lines[before:]]
        return result

    def node_ops(self, label: str) -> list[tuple[str, str]]:
        """(verb, node) of the cordon/drain/uncordon calls of one run, in order."""
        return [(c["verb"], c["argv"][1]) for c in self.calls[label]
                if c.get("verb") in ("cordon", "drain", "uncordon")]


def join(setup) -> None:
    """The hosts join at the old versions through the join playbook's runner."""
    from datetime import timedelta

    from corral.model import load_cluster
    from corral.nodes.join import join_material, new_bootstrap_token, run_join

    cluster = load_cluster(setup.clusters / f"{joinlab.CLUSTER}.yaml")
    saved = dict(os.environ)
    os.environ.update(setup.env)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # ansible-playbook
    try:
        material = join_material(joinlab.CLUSTER, setup.outputs)
        material["corral_join_token"] = new_bootstrap_token(timedelta(hours=1)).value
        report = run_join(cluster, material, ALL_HOSTS, runs_dir=setup.runs_dir, extra_vars=[setup.extra_vars])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert report.succeeded, {h: (r.status, r.task, r.message) for h, r in report.hosts.items()}


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory):
    ok, reason = available()
    if not ok:
        pytest.skip(f"hostlab unavailable: {reason}")
    lab = Lab(LabConfig(bridge="corralbr-upg", subnet="10.78.4.0/24", machine_prefix="upg-"))
    lab.start()
    repo = None
    hosts = []
    try:
        repo = AptRepo(lab, driver_versions=(OLD_DRIVER, NEW_DRIVER, JOIN_DRIVER),
                       k8s_versions=(OLD, NEW)).build().serve()
        workdir = tmp_path_factory.mktemp("corral-upgrade")
        hosts = lab.boot(ALL_HOSTS + [LATE_GPU])
        setup = joinlab.prepare(lab, repo, hosts, workdir, GPU_HOSTS, CPU_HOSTS)
        join(setup)
        up = Upgrade(lab, hosts, setup, workdir)
        up.state_path.write_text(json.dumps(initial_state([h for h in hosts if h.name != LATE_GPU])))
        yield up
    finally:
        joinlab.remove_hosts(lab, hosts)
        if repo is not None:
            repo.stop()
        lab.teardown()


@pytest.fixture(scope="module")
def infra(upgrade):
    config = str(upgrade.setup.ssh_config)
    return {name: testinfra.get_host(f"ssh://{name}", ssh_config=config) for name in ALL_HOSTS + [LATE_GPU]}


def kubelet_package(infra, host: str) -> str:
    return infra[host].package("kubelet").version


def test_joined_nodes_report_the_old_version(upgrade):
    nodes = {n: upgrade.state()["nodes"][n] for n in (CPU1, GPU1)}
    assert all(Path(n["root"], "var/lib/corral-fakes/kubelet-running.json").exists() for n in nodes.values())
    running = json.loads(Path(nodes[CPU1]["root"], "var/lib/corral-fakes/kubelet-running.json").read_text())
    assert running["kubeletVersion"] == f"v{OLD}"


def test_check_prints_the_batches_and_changes_nothing(upgrade, infra):
    result = upgrade.run("check", "--check", "--batch", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    batch1 = out.index(f"batch 1: {CPU_HOSTS[0]}, {CPU_HOSTS[1]}")
    batch2 = out.index(f"batch 2: {CPU_HOSTS[2]}, {GPU_HOSTS[0]}")
    assert batch1 < batch2 and "control-plane" not in out
    assert upgrade.node_ops("check") == []
    assert not [c for c in upgrade.calls["check"] if c["verb"] in ("annotate", "create", "apply")]
    assert all(kubelet_package(infra, h).startswith(OLD) for h in ALL_HOSTS)


def test_a_refused_drain_stops_the_host_and_spends_the_failure_budget(upgrade, infra):
    result = upgrade.run("budget", "--batch", "2", "--max-fail-percentage", "0")
    assert result.returncode == 1, result.stdout + result.stderr
    ops = upgrade.node_ops("budget")
    # Batch 1 only: both cordoned and drained, the refused one uncordoned at once.
    assert {n for _, n in ops} == {CPU1, CPU2}, ops
    assert ("cordon", CPU1) in ops and ("cordon", CPU2) in ops
    refused = [c for c in upgrade.calls["budget"] if c["verb"] == "drain" and c["rc"] != 0]
    assert [(c["argv"][1], c["refused"]) for c in refused] == [(CPU2, "db-0")]
    assert ops.index(("drain", CPU2)) < ops.index(("uncordon", CPU2))
    # The refused host did not stop its batch: cpu-001 was finished and uncordoned.
    assert ops.index(("uncordon", CPU1)) > ops.index(("drain", CPU1))
    # Every playbook call went through the runner's token and its RBAC rules.
    playbook_calls = [c for c in upgrade.calls["budget"] if c["verb"] in ("cordon", "drain", "uncordon", "annotate")]
    assert playbook_calls and all(c.get("as") == "corral-node-runner" for c in playbook_calls)
    # web-1 was evicted (its budget allowed it) and went to a schedulable node.
    state = upgrade.state()
    assert next(p for p in state["pods"] if p["name"] == "web-1")["node"] not in (CPU1, CPU2)
    assert kubelet_package(infra, CPU_HOSTS[0]).startswith(NEW)
    assert kubelet_package(infra, CPU_HOSTS[1]).startswith(OLD)
    assert all(kubelet_package(infra, h).startswith(OLD) for h in (CPU_HOSTS[2], GPU_HOSTS[0]))
    nodes = state["nodes"]
    assert not any(nodes[n].get("unschedulable") for n in nodes), nodes
    assert not any(nodes[n]["annotations"] for n in nodes)
    assert "drain of " + CPU2 in result.stdout
    # The hosts the stopped run never reached are named, from the API server.
    assert (f"3 node(s) not at {NEW} or still cordoned by corral (run corral upgrade again to resume): "
            f"{CPU_HOSTS[1]}, {CPU_HOSTS[2]}, {GPU_HOSTS[0]}") in " ".join(result.stdout.split())
    # The runner's token was revoked when the run ended (its bound Secret is gone).
    assert state["tokens"] and not state.get("secrets")


def test_an_upgrade_interrupted_on_a_host_leaves_it_cordoned(upgrade, infra):
    upgrade.edit_state(lambda s: s.update(pdbs=[p for p in s["pdbs"] if p["name"] != "db"]))
    fail_file = upgrade.hosts[GPU_HOSTS[0]].path("/etc/corral-fakes/kubeadm-upgrade-fail")
    fail_file.parent.mkdir(parents=True, exist_ok=True)
    fail_file.write_text("TEST FAKE: the control plane did not answer\n")
    result = upgrade.run("broken", "--batch", "2", "--max-fail-percentage", "50")
    assert result.returncode == 1, result.stdout + result.stderr
    ops = upgrade.node_ops("broken")
    assert CPU1 not in {n for _, n in ops}, "an upgraded node was touched again"
    # Batches [cpu-002, cpu-003] then [gpu-001]: the GPU host is cordoned
    # only after the first batch is uncordoned.
    first_gpu = ops.index(("cordon", GPU1))
    assert {n for _, n in ops[:first_gpu]} == {CPU2, CPU3}
    assert ("uncordon", CPU2) in ops[:first_gpu] and ("uncordon", CPU3) in ops[:first_gpu]
    assert ("uncordon", GPU1) not in ops
    node = upgrade.state()["nodes"][GPU1]
    assert node["unschedulable"] and node["annotations"] == {"corral.dev/cordoned-by": "corral-upgrade"}
    assert kubelet_package(infra, GPU_HOSTS[0]).startswith(NEW)
    assert infra[GPU_HOSTS[0]].package("nvidia-driver").version == f"{NEW_DRIVER}-1"


def test_the_next_run_resumes_with_the_interrupted_host_only(upgrade, infra):
    upgrade.hosts[GPU_HOSTS[0]].path("/etc/corral-fakes/kubeadm-upgrade-fail").unlink()
    result = upgrade.run("resume", "--batch", "2", "--max-fail-percentage", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    ops = upgrade.node_ops("resume")
    # Already cordoned by corral: no second cordon; drained again, uncordoned.
    assert ops == [("drain", GPU1), ("uncordon", GPU1)], ops
    state = upgrade.state()
    for name, node in state["nodes"].items():
        assert not node.get("unschedulable") and not node["annotations"], (name, node)
        running = json.loads(Path(node["root"], "var/lib/corral-fakes/kubelet-running.json").read_text())
        assert running["kubeletVersion"] == f"v{NEW}", name
    gpu = infra[GPU_HOSTS[0]]
    upgrades = gpu.file("/var/lib/corral-fakes/kubeadm-upgrade.jsonl").content_string.splitlines()
    assert [json.loads(line)["kubernetes_version"] for line in upgrades] == [NEW]
    assert "550.144.03" in gpu.check_output("nvidia-smi")
    assert {"kubelet", "kubeadm", "nvidia-driver"} <= set(gpu.check_output("apt-mark showhold").split())


def test_a_second_run_changes_nothing(upgrade):
    result = upgrade.run("again", "--batch", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert upgrade.node_ops("again") == []
    assert not [c for c in upgrade.calls["again"] if c["verb"] == "annotate"]
    rows = [line for line in result.stdout.splitlines() if "│" in line and ".sf1.internal" in line]
    assert len(rows) == len(ALL_HOSTS)
    for row in rows:
        cells = [c.strip() for c in row.split("│")]
        assert cells[2] == "ok" and cells[4] == "0", row


def test_join_drains_a_serving_gpu_node_for_its_driver_and_not_a_new_host(upgrade, infra):
    """`corral join` with the GPU pool at a new driver and a new GPU host in it."""
    text = (upgrade.clusters / f"{joinlab.CLUSTER}.yaml").read_text()
    assert NEW_DRIVER in text and json.dumps(GPU_HOSTS) in text
    clusters = upgrade.workdir / "clusters-driver"
    clusters.mkdir()
    (clusters / f"{joinlab.CLUSTER}.yaml").write_text(
        joinlab.with_host(text.replace(NEW_DRIVER, JOIN_DRIVER), GPU_HOSTS, upgrade.hosts[LATE_GPU]))
    # The new host's ssh keys recorded beside the others'.
    shutil.copy(upgrade.clusters / f"{joinlab.CLUSTER}.known_hosts", clusters)
    assert trust_host_keys(load_cluster(clusters / f"{joinlab.CLUSTER}.yaml")).added == [LATE_GPU]
    # A training pod on the serving GPU node (no budget: it may be evicted).
    upgrade.edit_state(lambda s: s["pods"].append(
        {"name": "train-0", "namespace": "ml", "node": GPU1, "labels": {"app": "train"}}))
    result = upgrade.run("driver", "--outputs", str(upgrade.setup.outputs), command="join", clusters=clusters)
    assert result.returncode == 0, result.stdout + result.stderr
    ops = upgrade.node_ops("driver")
    # The serving node only; the new host is not a node yet: nothing to drain.
    assert ops == [("cordon", GPU1), ("drain", GPU1), ("uncordon", GPU1)], ops
    calls = {c["verb"]: c for c in upgrade.calls["driver"] if c.get("verb") in ("drain", "uncordon")}
    # Drained before its driver changed, uncordoned after.
    assert calls["drain"]["hostDriver"] == f"{NEW_DRIVER}-1", calls["drain"]
    assert calls["uncordon"]["hostDriver"] == f"{JOIN_DRIVER}-1", calls["uncordon"]
    # Through the runner's least-privilege token, marked as the join's cordon.
    runner = [c for c in upgrade.calls["driver"] if c["verb"] in ("cordon", "drain", "uncordon", "annotate")
              or c["argv"][:2] == ["get", "nodes"]]
    assert runner and all(c.get("as") == "corral-node-runner" for c in runner), runner
    assert [c["argv"][3] for c in runner if c["verb"] == "annotate"] == [
        "corral.dev/cordoned-by=corral-join-driver", "corral.dev/cordoned-by-"]
    state = upgrade.state()
    assert next(p for p in state["pods"] if p["name"] == "train-0")["node"] not in (GPU1, None)
    node = state["nodes"][GPU1]
    assert not node.get("unschedulable") and not node["annotations"], node
    # The bootstrap token and the runner token's Secret are gone: both revoked.
    assert not state.get("secrets"), state.get("secrets")
    for host in (GPU_HOSTS[0], LATE_GPU):
        assert infra[host].package("nvidia-driver").version == f"{JOIN_DRIVER}-1", host
        assert JOIN_DRIVER in infra[host].check_output("nvidia-smi"), host
    assert infra[LATE_GPU].file("/etc/kubernetes/kubelet.conf").exists
    # The runner's kubeconfig and token are nowhere in the artifacts.
    tokens = [t["token"] for t in state["tokens"]]
    assert not [p for p in upgrade.setup.runs_dir.rglob("*") if p.is_file()
                and any(t in p.read_text(errors="ignore") for t in tokens)]

    # --force: the roles run on every host again; the serving GPU node's driver
    # is the pool's (its packages are held: dpkg says "hi"), so nothing is drained.
    again = upgrade.run("driver-again", "--outputs", str(upgrade.setup.outputs), "--force", command="join",
                        clusters=clusters)
    assert again.returncode == 0, again.stdout + again.stderr
    assert upgrade.node_ops("driver-again") == []
    assert [c["argv"][:2] for c in upgrade.calls["driver-again"] if c.get("as")] == [["get", "nodes"]]


def test_certs_reads_the_nodes_certificates_and_flags_one_about_to_expire(upgrade, tmp_path):
    """A real certificate (and its key, as the kubelet keeps them) expiring in 9 days on the GPU host."""
    from tests.certs.certgen import make_cert

    ca_pem, _, ca = make_cert("kubernetes", 3650, is_ca=True)
    cert_pem, key_pem, _ = make_cert(f"system:node:{GPU1}", 9, ca=ca)
    pem = upgrade.hosts[GPU_HOSTS[0]].path("/var/lib/kubelet/pki/kubelet-client-current.pem")
    original = pem.read_text()
    pem.write_text(cert_pem + key_pem)
    try:
        export = tmp_path / "export.json"
        export.write_text(json.dumps({"deployment": {"resources": []}}))
        env = joinlab.env_with(upgrade.setup)
        result = subprocess.run(
            [sys.executable, "-m", "corral", "certs", joinlab.CLUSTER, "--clusters", str(upgrade.clusters),
             "--export", str(export), "--no-network", "--runs-dir", str(upgrade.workdir / "certs-runs")],
            env=env, capture_output=True, text=True, timeout=600)
    finally:
        pem.write_text(original)
    assert result.returncode == 1, result.stdout + result.stderr
    flagged = " ".join(result.stdout.split())
    assert (f"1 certificate(s) expire within 30 days: {GPU_HOSTS[0]}:/var/lib/kubelet/pki/kubelet-client-current.pem "
            f"(CN=system:node:{GPU1})") in flagged
    assert "not read" not in result.stderr, result.stderr
    leaked = [p for p in (upgrade.workdir / "certs-runs").rglob("*") if p.is_file()
              and "PRIVATE KEY" in p.read_text(errors="ignore")]
    assert not leaked and "PRIVATE KEY" not in result.stdout
