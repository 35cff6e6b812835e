"""`corral upgrade` without hosts: skew rules, batches, the ordered plan, the
runner credential and its RBAC, the CLI's `--check` and its errors.

The API server is the fake kubectl of tests/upgrade (nodes without a host
root report the versions the state file gives them).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.manifests.runner_rbac import CLUSTER_ROLE, NAMESPACE, SERVICE_ACCOUNT, runner_rbac_objects
from corral.model import load_cluster
from corral.nodes.join import ClusterAccess
from corral.upgrade.plan import ClusterState, NodeState, build_plan, parse_batch, read_cluster_state, serial_batches
from corral.upgrade.versions import (
    KubeVersion, UpgradeError, check_control_plane_target, check_node_target,
)

ROOT = Path(__file__).resolve().parents[2]
FAKE_KUBECTL = Path(__file__).with_name("fake_kubectl")
V = KubeVersion.parse


# ------------------------------------------------------------------ skew rules
def test_versions_parse_with_or_without_v_and_reject_garbage():
    assert V("v1.31.4") == V("1.31.4") == KubeVersion(1, 31, 4)
    assert str(V("v1.32.0")) == "1.32.0"
    with pytest.raises(UpgradeError, match="--to: '1.32' is not a Kubernetes version"):
        V("1.32", "--to")


def test_control_plane_moves_one_minor_at_a_time_and_never_back():
    check_control_plane_target(V("1.32.0"), V("1.31.4"), {"a": V("1.31.4")})
    check_control_plane_target(V("1.31.5"), V("1.31.4"), {})
    with pytest.raises(UpgradeError, match=r"skips a minor version: upgrade to 1\.32\.x first"):
        check_control_plane_target(V("1.33.0"), V("1.31.4"), {})
    with pytest.raises(UpgradeError, match="does not downgrade"):
        check_control_plane_target(V("1.31.3"), V("1.31.4"), {})


def test_control_plane_may_not_leave_kubelets_more_than_three_minors_behind():
    check_control_plane_target(V("1.32.0"), V("1.31.0"), {"old": V("1.29.9")})
    with pytest.raises(UpgradeError, match=r"more than 3 minors ahead of 1 kubelet\(s\): old \(1\.28\.15\)"):
        check_control_plane_target(V("1.32.0"), V("1.31.0"), {"old": V("1.28.15"), "new": V("1.31.0")})


def test_kubelets_follow_the_control_plane_one_minor_at_a_time():
    check_node_target(V("1.32.0"), V("1.32.0"), {"a": V("1.31.4"), "b": V("1.32.0")})
    with pytest.raises(UpgradeError, match="upgrade the control plane first"):
        check_node_target(V("1.32.0"), V("1.31.4"), {"a": V("1.31.4")})
    with pytest.raises(UpgradeError, match=r"more than one minor behind 1\.32\.0: a \(1\.30\.2\)"):
        check_node_target(V("1.32.0"), V("1.32.0"), {"a": V("1.30.2")})
    with pytest.raises(UpgradeError, match="does not downgrade nodes"):
        check_node_target(V("1.31.4"), V("1.32.0"), {"a": V("1.32.0")})


# --------------------------------------------------------------------- batches
def test_batch_flag_is_a_count_or_a_percentage():
    assert parse_batch("5") == "5" and parse_batch("10%") == "10%"
    for bad in ("0", "0%", "101%", "-1", "ten", "5.5", ""):
        with pytest.raises(UpgradeError, match="--batch"):
            parse_batch(bad)


@settings(max_examples=200, deadline=None)
@given(hosts=st.integers(1, 400), value=st.integers(1, 100), percent=st.booleans())
def test_batches_are_the_ones_ansible_serial_makes(hosts, value, percent):
    """Ansible's own pct_to_int is the oracle: --check prints what the play does."""
    from ansible.utils.helpers import pct_to_int

    batch = f"{value}%" if percent else str(value)
    names = [f"h{i:03d}" for i in range(hosts)]
    batches = serial_batches(names, batch)
    size = pct_to_int(batch, hosts)
    assert [len(b) for b in batches[:-1]] == [size] * (len(batches) - 1)
    assert 0 < len(batches[-1]) <= size and sum(batches, []) == names


# ------------------------------------------------------------------------ plan
def _state(api: str, nodes: dict[str, str], cordoned: tuple[str, ...] = ()) -> ClusterState:
    return ClusterState(V(api), {n: NodeState(n, V(v), unschedulable=n in cordoned, cordoned_by_corral=n in cordoned)
                                 for n, v in nodes.items()})


def test_plan_orders_control_plane_then_cloud_pools_then_onprem_batches():
    jaguar = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    nodes = {f"gpu-{i:03d}": "1.31.4" for i in range(1, 73)}
    plan = build_plan(jaguar, V("1.32.0"), _state("1.31.4", nodes), "25%")
    phases = [s.phase for s in plan.steps]
    assert phases == sorted(phases, key=["control-plane", "cloud-pool", "on-prem"].index)
    assert [s.what for s in plan.steps if s.phase == "control-plane"] == [f"jaguar-apiserver-{i}" for i in range(5)]
    assert [s.what for s in plan.steps if s.phase == "cloud-pool"] == ["jaguar-cpu-d64"]
    assert [len(b) for b in plan.onprem_batches] == [18, 18, 18, 18]


def test_plan_skips_current_nodes_and_resumes_corral_cordons():
    jaguar = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    nodes = {f"gpu-{i:03d}": "1.32.0" for i in range(1, 73)} | {"gpu-003": "1.31.4"}
    plan = build_plan(jaguar, V("1.32.0"), _state("1.32.0", nodes, cordoned=("gpu-050",)), "10")
    assert plan.onprem_batches == [["gpu-003.sf1.internal", "gpu-050.sf1.internal"]]
    assert not [s for s in plan.steps if s.phase == "control-plane"]
    assert len(plan.onprem_current) == 70 and plan.onprem_not_nodes == []


def test_plan_names_hosts_that_are_not_nodes_yet():
    jaguar = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    plan = build_plan(jaguar, V("1.32.0"), _state("1.32.0", {"gpu-001": "1.31.4"}), "10%",
                      hosts=["gpu-001.sf1.internal", "gpu-002.sf1.internal"])
    assert plan.onprem_batches == [["gpu-001.sf1.internal"]]
    assert plan.onprem_not_nodes == ["gpu-002.sf1.internal"]


# ------------------------------------------------------------- fake API server
@pytest.fixture
def fake_api(tmp_path, monkeypatch):
    """The fake kubectl on PATH with a state file; returns a writer for the state."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(FAKE_KUBECTL)
    state_path, log = tmp_path / "state.json", tmp_path / "kubectl.jsonl"
    kubeconfig = tmp_path / "admin.kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n# TEST FAKE operator credential\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBE_STATE", str(state_path))
    monkeypatch.setenv("FAKE_KUBECTL_LOG", str(log))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))

    class Api:
        path = state_path

        def write(self, api: str, nodes: dict[str, str]) -> None:
            state_path.write_text(json.dumps({"serverVersion": f"v{api}", "nodes": {
                n: {"kubeletVersion": f"v{v}", "annotations": {}} for n, v in nodes.items()},
                "pods": [], "pdbs": []}))

        def state(self) -> dict:
            return json.loads(state_path.read_text())

        def calls(self) -> list[dict]:
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return Api()


def test_cluster_state_is_read_through_kubectl(fake_api):
    fake_api.write("1.32.0", {"gpu-001": "1.31.4", "gpu-002": "1.32.0"})
    state = read_cluster_state(ClusterAccess())
    assert state.api_server == V("1.32.0")
    assert state.kubelets == {"gpu-001": V("1.31.4"), "gpu-002": V("1.32.0")}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "corral", "upgrade", *args, "--clusters", str(ROOT / "clusters")],
                          capture_output=True, text=True, env=dict(os.environ, COLUMNS="200"), timeout=120)


def test_cli_check_prints_the_order_and_acts_on_nothing(fake_api):
    fake_api.write("1.31.4", {f"gpu-{i:03d}": "1.31.4" for i in range(1, 73)})
    result = _cli("jaguar", "--to", "1.32.0", "--check", "--batch", "36")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    positions = [out.index(text) for text in ("jaguar-apiserver-0", "jaguar-apiserver-4", "jaguar-cpu-d64",
                                             "batch 1: gpu-001.sf1.internal", "batch 2: gpu-037.sf1.internal")]
    assert positions == sorted(positions)
    assert {c["verb"] for c in fake_api.calls()} == {"version", "get"}


@pytest.mark.parametrize(("api", "to", "message"), [
    ("1.31.4", "1.33.0", "skips a minor version: upgrade to 1.32.x first"),
    ("1.31.4", "1.31", "--to: '1.31' is not a Kubernetes version"),
    ("1.32.0", "1.31.4", "does not downgrade nodes"),
])
def test_cli_refuses_skew_violations_with_a_clear_error(fake_api, api, to, message):
    fake_api.write(api, {"gpu-001": "1.31.4" if api == "1.31.4" else "1.32.0"})
    result = _cli("jaguar", "--to", to)
    assert result.returncode == 1
    assert message in " ".join(result.stderr.split()) and "Traceback" not in result.stderr
    assert not [c for c in fake_api.calls() if c["verb"] in ("cordon", "drain", "apply", "create")]


def test_cli_touches_no_node_while_the_control_plane_cannot_go_first(fake_api, monkeypatch):
    monkeypatch.setenv("PATH", str(FAKE_KUBECTL.parent.parent / "no-such-dir") + os.pathsep
                       + os.environ["PATH"].split(os.pathsep, 1)[0])  # the fake kubectl only: no pulumi
    fake_api.write("1.31.4", {"gpu-001": "1.31.4"})
    result = _cli("jaguar", "--to", "1.32.0", "--state-file", str(fake_api.path.with_name("cp.json")))
    assert result.returncode == 1
    assert "pulumi is not installed (progress kept in" in " ".join(result.stderr.split())
    assert not [c for c in fake_api.calls() if c["verb"] in ("cordon", "drain", "apply", "create")]


# ---------------------------------------------------------- runner credential
def test_runner_credential_is_short_lived_least_privileged_and_revoked(fake_api, tmp_path):
    from corral.upgrade.credential import runner_kubeconfig

    fake_api.write("1.32.0", {"gpu-001": "1.32.0"})
    copy = tmp_path / "runner-copy"

    def as_runner(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", "--kubeconfig", str(copy), *args], capture_output=True, text=True)

    with runner_kubeconfig(ClusterAccess(), timedelta(hours=2)) as cred:
        assert stat.S_IMODE(cred.kubeconfig.stat().st_mode) == 0o600
        config = json.loads(cred.kubeconfig.read_text())
        assert config["users"][0]["user"] == {"token": cred.token}
        assert config["clusters"][0]["cluster"]["server"] == "https://10.200.0.5:6443"
        copy.write_text(cred.kubeconfig.read_text())
        assert as_runner("get", "nodes", "-o", "json").returncode == 0
        assert as_runner("cordon", "gpu-001").returncode == 0
        denied = as_runner("apply", "-f", "-")
        assert denied.returncode == 1 and "Forbidden" in denied.stderr
        folder = cred.kubeconfig.parent
    state = fake_api.state()
    assert [(t["serviceAccount"], t["namespace"], t["duration"], t["boundSecret"]) for t in state["tokens"]] == [
        (SERVICE_ACCOUNT, NAMESPACE, "7200s", cred.binding_secret)]
    assert not folder.exists()
    # The bound Secret is gone: the token no longer authenticates.
    assert state["secrets"] == {}
    revoked = as_runner("get", "nodes", "-o", "json")
    assert revoked.returncode == 1 and "Unauthorized" in revoked.stderr


# ------------------------------------------------- corral join's drain credential
def test_join_gets_the_runner_credential_only_for_gpu_hosts_and_not_in_check_mode(fake_api, tmp_path):
    from corral.upgrade.join_drain import RUNNER_KUBECONFIG_VAR, gpu_hosts, join_drain_variables

    fake_api.write("1.31.4", {"gpu-001": "1.31.4"})
    cluster = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    gpu = gpu_hosts(cluster, ["gpu-001.sf1.internal"])
    assert gpu == ["gpu-001.sf1.internal"]
    runs = tmp_path / "runs"
    runs.mkdir()
    # --check (no access) and a run of CPU-only hosts: nothing is created.
    with join_drain_variables(cluster, gpu, None, timedelta(hours=1), runs) as variables:
        assert variables == {}
    with join_drain_variables(cluster, ["not-a-gpu-host"], ClusterAccess(), timedelta(hours=1), runs) as variables:
        assert variables == {}
    assert fake_api.calls() == []
    with join_drain_variables(cluster, gpu, ClusterAccess(), timedelta(hours=1), runs) as variables:
        kubeconfig = Path(variables[RUNNER_KUBECONFIG_VAR])
        assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
        token = json.loads(kubeconfig.read_text())["users"][0]["user"]["token"]
        (runs / "artifact.txt").write_text("nothing secret here\n")
    assert not kubeconfig.exists()
    state = fake_api.state()
    assert [(t["token"], t["duration"]) for t in state["tokens"]] == [(token, "3600s")]
    assert state["secrets"] == {}  # the token's bound Secret is gone: revoked


def test_join_drain_credential_refused_warns_and_a_leaked_token_fails_the_run(fake_api, tmp_path, monkeypatch):
    from corral.nodes.join import JoinError
    from corral.upgrade.join_drain import join_drain_variables

    fake_api.write("1.31.4", {"gpu-001": "1.31.4"})
    cluster = load_cluster(ROOT / "clusters" / "jaguar.yaml")
    runs = tmp_path / "runs"
    runs.mkdir()
    warnings = []
    monkeypatch.setenv("FAKE_KUBECTL_DENY", "apply")
    with join_drain_variables(cluster, ["gpu-001.sf1.internal"], ClusterAccess(), timedelta(hours=1), runs,
                              on_warning=warnings.append) as variables:
        assert variables == {}
    assert len(warnings) == 1 and "no drain credential" in warnings[0] and "not drained and fail" in warnings[0]
    monkeypatch.delenv("FAKE_KUBECTL_DENY")
    with pytest.raises(JoinError, match="runner's token appeared in run artifacts"):
        with join_drain_variables(cluster, ["gpu-001.sf1.internal"], ClusterAccess(), timedelta(hours=1),
                                  runs) as variables:
            config = json.loads(Path(variables["corral_runner_kubeconfig"]).read_text())
            (runs / "leak.json").write_text(json.dumps(config))
    assert not (runs / "leak.json").exists()
    assert fake_api.state()["secrets"] == {}


# ------------------------------------------------------------------ RBAC rules
def _can(verb: str, resource: str, group: str = "") -> bool:
    objects = {o["kind"]: o for o in runner_rbac_objects()}
    return any((group in r["apiGroups"] or "*" in r["apiGroups"]) and (resource in r["resources"] or "*" in r["resources"])
               and (verb in r["verbs"] or "*" in r["verbs"]) for r in objects["ClusterRole"]["rules"])


@pytest.mark.parametrize(("verb", "resource", "group"), [
    ("get", "nodes", ""), ("list", "nodes", ""), ("patch", "nodes", ""),
    ("list", "pods", ""), ("get", "pods", ""), ("create", "pods/eviction", ""),
    ("get", "daemonsets", "apps"), ("list", "poddisruptionbudgets", "policy"),
])
def test_runner_role_allows_what_cordon_drain_and_uncordon_call(verb, resource, group):
    assert _can(verb, resource, group)


@pytest.mark.parametrize(("verb", "resource", "group"), [
    ("delete", "pods", ""), ("delete", "nodes", ""), ("update", "nodes", ""), ("create", "pods", ""),
    ("get", "secrets", ""), ("list", "secrets", ""), ("create", "secrets", ""),
    ("create", "serviceaccounts/token", ""), ("patch", "nodes/status", ""),
    ("escalate", "clusterroles", "rbac.authorization.k8s.io"), ("bind", "clusterroles", "rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings", "rbac.authorization.k8s.io"), ("impersonate", "users", ""),
    ("patch", "daemonsets", "apps"), ("delete", "poddisruptionbudgets", "policy"),
])
def test_runner_role_allows_nothing_else(verb, resource, group):
    assert not _can(verb, resource, group)


def test_runner_identity_is_one_service_account_not_system_masters():
    objects = {o["kind"]: o for o in runner_rbac_objects()}
    rules = objects["ClusterRole"]["rules"]
    assert all("*" not in r[key] for r in rules for key in ("apiGroups", "resources", "verbs"))
    assert not any("nonResourceURLs" in r or "resourceNames" in r for r in rules)
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": CLUSTER_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]
    assert objects["ServiceAccount"]["automountServiceAccountToken"] is False
