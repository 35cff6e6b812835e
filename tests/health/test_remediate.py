"""Remediation that executes: `corral nodes health CLUSTER --remediate`, with kubectl,
ansible-playbook and the clouds' CLIs faked at the process boundary (tests/health/fake_bin,
fake_ansible); the fake cluster is a JSON node list those fakes change."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.health.classify import FAULT_CONDITIONS, PREFLIGHT_CONDITION
from corral.health.remediate import RemediationError, instance_command

from .conftest import FAKE_BIN, ROOT, cluster
from .test_nodes_health import h100_fleet, node, sick

FAKE_ANSIBLE = FAKE_BIN.parent / "fake_ansible"
PREFLIGHT, UNHEALTHY, CORDON_MARK = "corral.dev/preflight", "corral.dev/unhealthy", "corral.dev/cordoned-by"


@pytest.mark.parametrize(("cloud", "provider_id", "argv"), [
    ("aws", "aws:///us-east-1b/i-0abc123def4567890",
     ["aws", "autoscaling", "terminate-instance-in-auto-scaling-group", "--instance-id", "i-0abc123def4567890",
      "--no-should-decrement-desired-capacity", "--region", "us-east-1"]),
    ("gcp", "gce://ml-prod/us-central1-a/ibis-gpu-a100-a-x7k2",
     ["gcloud", "compute", "instance-groups", "managed", "recreate-instances", "ibis-gpu-a100-a",
      "--instances=ibis-gpu-a100-a-x7k2", "--zone=us-central1-a", "--project=ml-prod", "--quiet"]),
    ("azure", "azure:///subscriptions/0000-11/resourceGroups/jaguar-rg/providers/Microsoft.Compute/"
              "virtualMachineScaleSets/jaguar-gpu-1/virtualMachines/17",
     ["az", "vmss", "delete-instances", "--subscription", "0000-11", "--resource-group", "jaguar-rg",
      "--name", "jaguar-gpu-1", "--instance-ids", "17"]),
])
def test_instance_command_per_cloud(cloud, provider_id, argv):
    assert instance_command(cloud, provider_id) == argv


@pytest.mark.parametrize("provider_id", ["", "aws:///us-east-1b/i-0abc; rm -rf /", "gce://p/z/name",
                                         "kind://docker/kind/kind-worker"])
def test_instance_command_refuses_what_it_cannot_place(provider_id):
    with pytest.raises(RemediationError, match="cannot find the machine"):
        instance_command("aws" if provider_id.startswith("aws") else "gcp", provider_id)


def invoke(tmp_path, nodes, name="jaguar", *args, env=None, cluster_dir=None):
    state = tmp_path / "nodes.json"
    if nodes is not None:
        state.write_text(json.dumps(nodes))
    (tmp_path / "k.conf").write_text("fake")
    full_env = {"PATH": f"{FAKE_ANSIBLE}{os.pathsep}{FAKE_BIN}{os.pathsep}{os.environ['PATH']}",
                "FAKE_NODES": str(state), "FAKE_CLOUD_LOG": str(tmp_path / "cloud.log"), **(env or {})}
    result = CliRunner().invoke(app, ["nodes", "health", name, "--clusters", str(cluster_dir or ROOT / "clusters"),
                                      "--kubeconfig", str(tmp_path / "k.conf"), "--runs-dir", str(tmp_path / "runs"),
                                      "--remediate", *args], env=full_env)
    return result


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def state(tmp_path) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in json.loads((tmp_path / "nodes.json").read_text())}


def test_onprem_reboots_in_budgeted_batches_then_a_second_run_changes_nothing(tmp_path):
    result = invoke(tmp_path, h100_fleet(7))
    assert result.exit_code == 0, result.output
    runs = read_log(tmp_path / "nodes.json.ansible.log")
    # 10% of 64 = 6 at once: two runs of the playbook, one batch each.
    assert [len(r["argv"][r["argv"].index("--limit") + 1].split(",")) for r in runs] == [6, 1]
    assert [r["vars"]["corral_remediate_batch"] for r in runs] == [6, 1]
    assert all(r["vars"]["corral_runner_kubeconfig"] == str((tmp_path / "k.conf").resolve()) for r in runs)
    assert "playbooks/remediate.yml" in runs[0]["argv"]
    after = state(tmp_path)
    for i in range(1, 8):
        n = after[f"gpu-{i:03d}.sf1.internal"]
        assert not n["spec"]["taints"] and not n["spec"].get("unschedulable")
        assert n["metadata"]["annotations"]["fake.corral.dev/reboots"] == "1"
    assert "remediated 7 of 7 node(s); 0 failed" in result.stdout
    again = invoke(tmp_path, None)
    assert again.exit_code == 0 and "nothing to remediate" in again.stdout
    assert len(read_log(tmp_path / "nodes.json.ansible.log")) == 2   # no new Ansible run


def test_failure_budget_stops_the_run_and_holds_the_rest(tmp_path):
    result = invoke(tmp_path, h100_fleet(13), env={"FAKE_REBOOT_OUTCOMES": json.dumps(
        {"gpu-002.sf1.internal": "fail"})})
    assert result.exit_code == 1, result.output
    runs = read_log(tmp_path / "nodes.json.ansible.log")
    assert len(runs) == 1          # batch 1 (6 nodes) ran; maxFailedNodes 1 is spent
    assert "gpu-002.sf1.internal: reboot FAILED: still tainted corral.dev/preflight; preflight: " \
           "GPUCountMismatch: 7 GPUs visible" in result.stdout
    assert "held in pool gpu-h100-sf1 (failure budget spent (1 of maxFailedNodes 1)): gpu-007.sf1.internal" \
           in result.stdout
    assert "remediated 5 of 6 node(s); 1 failed" in result.stdout
    assert UNHEALTHY in {t["key"] for t in state(tmp_path)["gpu-008.sf1.internal"]["spec"]["taints"]}


def test_a_bigger_failure_budget_lets_the_run_go_on(tmp_path):
    text = (ROOT / "clusters" / "jaguar.yaml").read_text()
    folder = tmp_path / "clusters"
    folder.mkdir()
    assert "health:" not in text
    (folder / "jaguar.yaml").write_text(text + "health:\n  remediation:\n    maxFailedNodes: 3\n")
    result = invoke(tmp_path, h100_fleet(13), env={"FAKE_REBOOT_OUTCOMES": json.dumps(
        {"gpu-002.sf1.internal": "fail"})}, cluster_dir=folder)
    assert len(read_log(tmp_path / "nodes.json.ansible.log")) == 3
    assert result.exit_code == 1 and "remediated 12 of 13 node(s); 1 failed" in result.stdout


def test_an_interrupted_remediation_is_finished(tmp_path):
    # Healthy again (the agent lifted its taints) but still cordoned by the run that died.
    left = node("gpu-003.sf1.internal", "gpu-h100-sf1", cordoned=True)
    left["metadata"]["annotations"] = {CORDON_MARK: "corral-remediation"}
    operator = node("gpu-004.sf1.internal", "gpu-h100-sf1", cordoned=True)  # an operator's cordon
    fleet = h100_fleet(0, total=20)        # 10% = 2 out at once; the operator's cordon is one
    fleet[2:4] = [left, operator]
    result = invoke(tmp_path, fleet)
    assert result.exit_code == 0, result.output
    [run] = read_log(tmp_path / "nodes.json.ansible.log")
    assert run["argv"][run["argv"].index("--limit") + 1] == "gpu-003.sf1.internal"
    assert state(tmp_path)["gpu-004.sf1.internal"]["spec"]["unschedulable"] is True


def heron_nodes(n_sick: int, total: int = 12, pool: str = "gpu-a10g") -> list[dict]:
    nodes = []
    for i in range(total):
        name = f"ip-10-0-1-{i}.ec2.internal"
        n = sick(name, pool=pool, cluster_name="heron") if i < n_sick else node(name, pool, cluster_name="heron")
        n["spec"]["providerID"] = f"aws:///us-east-1a/i-0{i:016x}"
        nodes.append(n)
    return nodes


def test_cloud_nodes_are_drained_and_their_instances_replaced_one_batch_per_run(tmp_path):
    result = invoke(tmp_path, heron_nodes(3), "heron")       # 10% of 12 -> 1 at a time
    assert result.exit_code == 0, result.output
    calls = [c[2:] for c in read_log(tmp_path / "nodes.json.log") if c[2:4] != ["get", "nodes"]]
    first = "ip-10-0-1-0.ec2.internal"
    assert calls == [["get", "node", first, "-o", "json"],
                     ["annotate", "node", first, f"{CORDON_MARK}=corral-remediation", "--overwrite"],
                     ["cordon", first],
                     ["drain", first, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=900s"],
                     ["delete", "node", first, "--ignore-not-found"]]
    assert (tmp_path / "cloud.log").read_text().splitlines() == [
        "aws autoscaling terminate-instance-in-auto-scaling-group --instance-id i-00000000000000000 "
        "--no-should-decrement-desired-capacity --region us-east-1"]
    assert first not in state(tmp_path)
    assert "held in pool gpu-a10g (next batch after the replacements have joined: run again): " \
           "ip-10-0-1-1.ec2.internal, ip-10-0-1-2.ec2.internal" in result.stdout


def test_cloud_replace_stops_at_a_refused_drain_or_a_failed_cloud_call(tmp_path):
    nodes = heron_nodes(1)
    nodes[0]["metadata"]["annotations"] = {"fake.corral.dev/drain": "refuse"}
    result = invoke(tmp_path, nodes, "heron")
    assert result.exit_code == 1
    assert "reboot" not in result.stdout and "violate the pod's disruption budget" in result.stdout
    assert not (tmp_path / "cloud.log").exists()                  # no instance touched
    assert "ip-10-0-1-0.ec2.internal" in state(tmp_path)

    result = invoke(tmp_path, heron_nodes(1), "heron", env={"FAKE_CLOUD_FAIL": "An error occurred (AccessDenied)"})
    assert result.exit_code == 1
    assert "aws exit 254: An error occurred (AccessDenied) (the node stays cordoned)" in result.stdout
    left = state(tmp_path)["ip-10-0-1-0.ec2.internal"]
    assert left["spec"]["unschedulable"] is True


def test_check_shows_the_cloud_commands_and_changes_nothing(tmp_path):
    result = invoke(tmp_path, heron_nodes(2), "heron", "--check")
    assert result.exit_code == 0, result.output
    assert "aws autoscaling terminate-instance-in-auto-scaling-group --instance-id i-00000000000000000" in result.stdout
    assert "kubectl drain ip-10-0-1-0.ec2.internal --ignore-daemonsets" in result.stdout
    assert all(c[2:4] == ["get", "nodes"] for c in read_log(tmp_path / "nodes.json.log"))
    assert not (tmp_path / "cloud.log").exists()


def test_check_without_remediate_is_refused(tmp_path):
    (tmp_path / "nodes.json").write_text("[]")
    result = CliRunner().invoke(app, ["nodes", "health", "jaguar", "--clusters", str(ROOT / "clusters"), "--check"],
                                env={"PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}",
                                     "FAKE_NODES": str(tmp_path / "nodes.json"), "KUBECONFIG": "x"})
    assert result.exit_code == 1 and "--check goes with --remediate" in result.output


def test_a_node_someone_else_cordoned_is_left_to_them(tmp_path):
    fleet = h100_fleet(2, total=40)
    fleet[1]["spec"]["unschedulable"] = True          # gpu-002: an operator looks at it
    fleet[1]["metadata"]["annotations"] = {CORDON_MARK: "corral-upgrade"}   # or an upgrade holds it
    result = invoke(tmp_path, fleet)
    assert result.exit_code == 0, result.output
    [run] = read_log(tmp_path / "nodes.json.ansible.log")
    assert run["argv"][run["argv"].index("--limit") + 1] == "gpu-001.sf1.internal"
    assert "left alone in pool gpu-h100-sf1 (cordoned by someone else): gpu-002.sf1.internal" in result.stdout
    assert state(tmp_path)["gpu-002.sf1.internal"]["spec"]["unschedulable"] is True


def test_the_playbook_names_every_fault_condition():
    # Its failure message lists the node's fault conditions: it must know them all.
    text = (ROOT / "ansible" / "playbooks" / "remediate.yml").read_text()
    assert all(c in text for c in (*FAULT_CONDITIONS, PREFLIGHT_CONDITION))
