"""`corral nodes health`: reading nodes through a fake kubectl, the report and the remediation plan."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.health.report import assess, plan_remediation

from .conftest import FAKE_BIN, ROOT, cluster

UNHEALTHY = "corral.dev/unhealthy"


def node(name, pool, taints=(), conditions=(), ready=True, cordoned=False, cluster_name="jaguar"):
    conds = [{"type": "Ready", "status": "True" if ready else "False"}] + list(conditions)
    spec = {"taints": list(taints)}
    if cordoned:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": {"corral.dev/pool": pool, "corral.dev/cluster": cluster_name}},
            "spec": spec, "status": {"conditions": conds}}


def sick(name, pool="gpu-h100-sf1", effect="NoExecute", **kw):
    return node(name, pool, taints=[{"key": UNHEALTHY, "value": "GPUXidFault", "effect": effect}],
                conditions=[{"type": "GPUXidFault", "status": "True", "reason": "Xid79",
                             "message": "Xid 79 on 0000:2b:00: GPU has fallen off the bus."}], **kw)


def h100_fleet(n_sick: int, total: int = 64, out_of_service: int = 0):
    nodes = [sick(f"gpu-{i:03d}.sf1.internal") for i in range(1, n_sick + 1)]
    for i in range(n_sick + 1, total + 1):
        nodes.append(node(f"gpu-{i:03d}.sf1.internal", "gpu-h100-sf1", ready=i > n_sick + out_of_service))
    return nodes


def test_report_names_the_reasons():
    jaguar = cluster("jaguar")
    nodes = [sick("gpu-001.sf1.internal"),
             node("gpu-002.sf1.internal", "gpu-h100-sf1",
                  taints=[{"key": "corral.dev/preflight", "value": "pending", "effect": "NoSchedule"}],
                  conditions=[{"type": "GPUPreflightPassed", "status": "False", "reason": "GPUCountMismatch",
                               "message": "7 GPUs visible, the pool declares 8"}]),
             node("gpu-003.sf1.internal", "gpu-h100-sf1"),
             node("other", "gpu-h100-sf1", cluster_name="heron"),   # another cluster's node
             node("api-0", "no-such-pool")]
    health = {h.name: h for h in assess(jaguar, nodes)}
    assert set(health) == {"gpu-001.sf1.internal", "gpu-002.sf1.internal", "gpu-003.sf1.internal"}
    assert (health["gpu-001.sf1.internal"].state, health["gpu-001.sf1.internal"].effect) == ("unhealthy", "NoExecute")
    assert health["gpu-001.sf1.internal"].reasons == [
        "GPUXidFault: Xid79: Xid 79 on 0000:2b:00: GPU has fallen off the bus."]
    assert health["gpu-002.sf1.internal"].state == "preflight"
    assert "GPUCountMismatch: 7 GPUs visible" in health["gpu-002.sf1.internal"].reasons[0]
    assert health["gpu-003.sf1.internal"].state == "healthy"


@pytest.mark.parametrize(("n_sick", "out", "batches"), [
    (1, 0, [1]),
    (6, 0, [6]),            # 10% of 64 = 6 at once
    (13, 0, [6, 6, 1]),
    (13, 4, [2, 2, 2, 2, 2, 2, 1]),   # 4 nodes already down: 2 left in the budget
])
def test_plan_never_takes_more_than_the_budget(n_sick, out, batches):
    jaguar = cluster("jaguar")
    plan = plan_remediation(jaguar, assess(jaguar, h100_fleet(n_sick, out_of_service=out)))
    assert [len(b.nodes) for b in plan.batches] == batches
    assert all(b.action == "reboot" and b.pool == "gpu-h100-sf1" for b in plan.batches)
    assert sorted(n for b in plan.batches for n in b.nodes) == [f"gpu-{i:03d}.sf1.internal" for i in
                                                               range(1, n_sick + 1)]


def test_plan_holds_when_the_pool_is_already_out_or_the_policy_says_none():
    jaguar = cluster("jaguar")
    plan = plan_remediation(jaguar, assess(jaguar, h100_fleet(2, out_of_service=6)))
    assert plan.batches == [] and plan.held == {"gpu-h100-sf1": ["gpu-001.sf1.internal", "gpu-002.sf1.internal"]}
    jaguar.health.remediation.onprem = "none"
    assert plan_remediation(jaguar, assess(jaguar, h100_fleet(2))).batches == []
    # A small pool still gets one node at a time.
    jaguar.health.remediation.onprem = "reboot"
    plan = plan_remediation(jaguar, assess(jaguar, h100_fleet(3, total=5)))
    assert [len(b.nodes) for b in plan.batches] == [1, 1, 1]


def test_cloud_pools_are_replaced():
    heron = cluster("heron")
    pool = next(p for p in heron.node_pools if p.gpu)
    nodes = [sick(f"ip-10-0-0-{i}", pool=pool.name, cluster_name="heron") for i in range(2)]
    plan = plan_remediation(heron, assess(heron, nodes))
    assert {b.action for b in plan.batches} == {"replace"}


def run_cli(tmp_path, nodes, *args, fail=False):
    state = tmp_path / "nodes.json"
    state.write_text(json.dumps(nodes))
    env = {"PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}", "FAKE_NODES": str(state),
           "KUBECONFIG": str(tmp_path / "admin.conf")}
    if fail:
        env["FAKE_KUBECTL_FAIL"] = "1"
    result = CliRunner().invoke(app, ["nodes", "health", "jaguar", "--clusters", str(ROOT / "clusters"), *args],
                                env=env)
    calls = [json.loads(line) for line in (tmp_path / "nodes.json.log").read_text().splitlines()] \
        if (tmp_path / "nodes.json.log").exists() else []
    return result, calls


def test_cli_lists_unhealthy_nodes_and_the_check_plan(tmp_path):
    (tmp_path / "k.conf").write_text("fake")
    result, calls = run_cli(tmp_path, h100_fleet(7), "--remediate", "--check", "--kubeconfig", str(tmp_path / "k.conf"))
    assert result.exit_code == 0, result.output
    assert calls == [["--kubeconfig", str(tmp_path / "k.conf"), "get", "nodes", "-o", "json"]]  # reads only
    assert "gpu-007.sf1.internal" in result.stdout and "Xid79" in result.stdout
    assert "64 GPU nodes: 7 unhealthy, 0 behind preflight, 57 healthy" in result.stdout
    assert "remediation plan (check: nothing is changed)" in result.stdout
    assert "batch 1: reboot gpu-001.sf1.internal, " in result.stdout
    assert "batch 2: reboot gpu-007.sf1.internal (pool gpu-h100-sf1, budget 6)" in result.stdout
    assert "ansible-playbook -i INVENTORY playbooks/remediate.yml --limit gpu-007.sf1.internal" in result.stdout
    assert not (tmp_path / "nodes.json.ansible.log").exists()


def test_cli_reports_kubectl_failures_without_a_traceback(tmp_path):
    result, _ = run_cli(tmp_path, [], fail=True)
    assert result.exit_code == 1
    assert "kubectl get nodes failed (exit 1): Error from server (Forbidden)" in result.output
    assert "Traceback" not in result.output
