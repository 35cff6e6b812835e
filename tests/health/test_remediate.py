"""Remediation that executes: `corral nodes health CLUSTER --remediate`, with kubectl,
ansible-playbook and the clouds' CLIs faked at the process boundary (tests/health/fake_bin,
fake_ansible); the fake cluster is a JSON node list those fakes change. Cloud nodes' instances
are verified against the stack output nodeGroups (passed as --outputs FILE, the shape
tests/infra/test_node_groups_output.py holds the program to) and the fake CLIs' membership
answers ($FAKE_CLOUD_MEMBERS) before anything is touched (tests/health/test_instances.py has
the matching itself)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.health.classify import FAULT_CONDITIONS, PREFLIGHT_CONDITION

from .conftest import FAKE_BIN, ROOT, cluster
from .test_nodes_health import h100_fleet, node, sick

FAKE_ANSIBLE = FAKE_BIN.parent / "fake_ansible"
PREFLIGHT, UNHEALTHY, CORDON_MARK = "corral.dev/preflight", "corral.dev/unhealthy", "corral.dev/cordoned-by"


# The stack outputs `pulumi up` exports (the parts remediation reads).
STACK_OUTPUTS = {
    "heron": {"nodeGroups": {
        "gpu-a10g": [{"provider": "aws", "name": "heron-gpu-a10g", "region": "us-west-2",
                      "zones": ["us-west-2a", "us-west-2b"]}],
        "gpu-a10g-inference": [{"provider": "aws", "name": "heron-gpu-a10g-inference", "region": "us-west-2",
                                "zones": ["us-west-2a"]}]}},
    "ibis": {"nodeGroups": {
        "gpu-a100": [{"provider": "gcp", "name": f"ibis-gpu-a100-{z}", "region": "us-central1",
                      "zones": [f"us-central1-{z}"], "project": "corral-ibis"} for z in "ac"]}},
}


def invoke(tmp_path, nodes, name="jaguar", *args, env=None, cluster_dir=None, members=None):
    state = tmp_path / "nodes.json"
    if nodes is not None:
        state.write_text(json.dumps(nodes))
    (tmp_path / "k.conf").write_text("fake")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(STACK_OUTPUTS.get(name, {"nodeGroups": {}})))
    if members is not None:
        (tmp_path / "members.json").write_text(json.dumps(members))
    full_env = {"PATH": f"{FAKE_ANSIBLE}{os.pathsep}{FAKE_BIN}{os.pathsep}{os.environ['PATH']}",
                "FAKE_NODES": str(state), "FAKE_CLOUD_LOG": str(tmp_path / "cloud.log"),
                "FAKE_CLOUD_MEMBERS": str(tmp_path / "members.json"), **(env or {})}
    result = CliRunner().invoke(app, ["nodes", "health", name, "--clusters", str(cluster_dir or ROOT / "clusters"),
                                      "--kubeconfig", str(tmp_path / "k.conf"), "--runs-dir", str(tmp_path / "runs"),
                                      "--outputs", str(outputs), "--remediate", *args], env=full_env)
    return result


def with_failure_budget(tmp_path, name: str, max_failed: int):
    """A clusters folder holding `name`'s cluster file with health.remediation.maxFailedNodes."""
    text = (ROOT / "clusters" / f"{name}.yaml").read_text()
    folder = tmp_path / "clusters"
    folder.mkdir()
    budget = f"  remediation:\n    maxFailedNodes: {max_failed}\n"
    text = text.replace("health:\n", "health:\n" + budget, 1) if "\nhealth:\n" in text else text + "health:\n" + budget
    (folder / f"{name}.yaml").write_text(text)
    return folder


def cloud_calls(tmp_path) -> list[str]:
    log = tmp_path / "cloud.log"
    return log.read_text().splitlines() if log.exists() else []


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
    folder = with_failure_budget(tmp_path, "jaguar", 3)
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
        n["spec"]["providerID"] = f"aws:///us-west-2a/i-0{i:016x}"
        nodes.append(n)
    return nodes


def heron_members(total: int = 12, group: str = "heron-gpu-a10g") -> list[dict]:
    """What AWS knows: every heron node's instance, in its pool's Auto Scaling group."""
    return [{"cloud": "aws", "instance": f"i-0{i:016x}", "group": group, "zone": "us-west-2a"} for i in range(total)]


DESCRIBE = "aws autoscaling describe-auto-scaling-instances --instance-ids {} --region us-west-2 --output json"


def test_cloud_nodes_are_drained_and_their_instances_replaced_one_batch_per_run(tmp_path):
    result = invoke(tmp_path, heron_nodes(3), "heron", members=heron_members())   # 10% of 12 -> 1 at a time
    assert result.exit_code == 0, result.output
    calls = [c[2:] for c in read_log(tmp_path / "nodes.json.log") if c[2:4] != ["get", "nodes"]]
    first = "ip-10-0-1-0.ec2.internal"
    assert calls == [["get", "node", first, "-o", "json"],
                     ["annotate", "node", first, f"{CORDON_MARK}=corral-remediation", "--overwrite"],
                     ["cordon", first],
                     ["drain", first, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=900s"],
                     ["delete", "node", first, "--ignore-not-found"]]
    assert cloud_calls(tmp_path) == [
        DESCRIBE.format("i-00000000000000000"),     # the instance is heron-gpu-a10g's: confirmed first
        "aws autoscaling terminate-instance-in-auto-scaling-group --instance-id i-00000000000000000 "
        "--no-should-decrement-desired-capacity --region us-west-2"]
    assert first not in state(tmp_path)
    assert "held in pool gpu-a10g (next batch after the replacements have joined: run again): " \
           "ip-10-0-1-1.ec2.internal, ip-10-0-1-2.ec2.internal" in result.stdout


def test_cloud_replace_stops_at_a_refused_drain_or_a_failed_cloud_call(tmp_path):
    nodes = heron_nodes(1)
    nodes[0]["metadata"]["annotations"] = {"fake.corral.dev/drain": "refuse"}
    result = invoke(tmp_path, nodes, "heron", members=heron_members())
    assert result.exit_code == 1
    assert "reboot" not in result.stdout and "violate the pod's disruption budget" in result.stdout
    assert cloud_calls(tmp_path) == [DESCRIBE.format("i-00000000000000000")]   # no instance touched
    assert "ip-10-0-1-0.ec2.internal" in state(tmp_path)

    result = invoke(tmp_path, heron_nodes(1), "heron", env={"FAKE_CLOUD_FAIL": "An error occurred (AccessDenied)"})
    assert result.exit_code == 1
    assert "aws exit 254: An error occurred (AccessDenied) (the node stays cordoned)" in result.stdout
    left = state(tmp_path)["ip-10-0-1-0.ec2.internal"]
    assert left["spec"]["unschedulable"] is True


def test_check_shows_the_cloud_commands_and_changes_nothing(tmp_path):
    nodes = heron_nodes(2)
    nodes[1]["spec"]["providerID"] = "aws:///us-east-1a/i-0fffffffffffffff0"     # another region
    result = invoke(tmp_path, nodes, "heron", "--check")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    first = lines.index(DESCRIBE.format("i-00000000000000000") + "  (must list i-00000000000000000 in heron-gpu-a10g)")
    assert lines[first + 3] == "kubectl drain ip-10-0-1-0.ec2.internal --ignore-daemonsets --delete-emptydir-data " \
                               "--timeout=900s"
    assert lines[first + 4].startswith("aws autoscaling terminate-instance-in-auto-scaling-group --instance-id "
                                       "i-00000000000000000 --no-should-decrement-desired-capacity --region us-west-2")
    assert "(refused: refused node ip-10-0-1-1.ec2.internal (providerID aws:///us-east-1a/i-0fffffffffffffff0): " \
           "zone us-east-1a is in no group of pool gpu-a10g" in " ".join(result.stdout.split())
    assert all(c[2:4] == ["get", "nodes"] for c in read_log(tmp_path / "nodes.json.log"))
    assert cloud_calls(tmp_path) == []


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


def ibis_nodes(provider_ids: list[str]) -> list[dict]:
    nodes = []
    for i, provider_id in enumerate(provider_ids):
        n = sick(f"ibis-gpu-a100-{i}", pool="gpu-a100", cluster_name="ibis")
        n["spec"]["providerID"] = provider_id
        nodes.append(n)
    return nodes + [node(f"ibis-gpu-a100-ok-{i}", "gpu-a100", cluster_name="ibis") for i in range(20)]


def test_a_forged_provider_id_in_another_project_is_refused_and_nothing_touched(tmp_path):
    """The finding: a node registers as gce://other-project/... and marks itself unhealthy."""
    forged = "gce://other-project/us-central1-a/db-primary-mig-x7k2"
    result = invoke(tmp_path, ibis_nodes([forged]), "ibis",
                    members=[{"cloud": "gcp", "project": "other-project", "zone": "us-central1-a",
                              "group": "db-primary-mig", "instance": "db-primary-mig-x7k2"}])
    assert result.exit_code == 1, result.output
    out = " ".join(result.stdout.split())
    assert (f"ibis-gpu-a100-0: replace FAILED: refused node ibis-gpu-a100-0 (providerID {forged}): project "
            "other-project is not this cluster's; expected an instance of project corral-ibis, region "
            "us-central1, MIG ibis-gpu-a100-a (us-central1-a) or MIG ibis-gpu-a100-c (us-central1-c) of pool "
            "gpu-a100") in out
    assert cloud_calls(tmp_path) == []                          # not even a lookup in the other project
    after = state(tmp_path)["ibis-gpu-a100-0"]
    assert not after["spec"].get("unschedulable")               # neither cordoned nor drained
    assert [c[2:4] for c in read_log(tmp_path / "nodes.json.log") if c[2:4] != ["get", "nodes"]] == []


def test_an_instance_of_another_auto_scaling_group_is_refused_and_the_run_goes_on_within_its_budget(tmp_path):
    folder = with_failure_budget(tmp_path, "heron", 2)
    members = heron_members()
    members[0]["group"] = "payments-db"       # what ip-10-0-1-0 claims is another group's machine
    result = invoke(tmp_path, heron_nodes(3), "heron", members=members, cluster_dir=folder)
    assert result.exit_code == 1, result.output
    out = " ".join(result.stdout.split())
    assert ("ip-10-0-1-0.ec2.internal: replace FAILED: refused node ip-10-0-1-0.ec2.internal (providerID "
            "aws:///us-west-2a/i-00000000000000000): AWS says it is in Auto Scaling group payments-db (us-west-2a); "
            "expected Auto Scaling group heron-gpu-a10g (us-west-2a, us-west-2b) of pool gpu-a10g") in out
    # Held and untouched; the next batch of the pool ran (nothing of the first was taken away).
    assert cloud_calls(tmp_path) == [
        DESCRIBE.format("i-00000000000000000"), DESCRIBE.format("i-00000000000000001"),
        "aws autoscaling terminate-instance-in-auto-scaling-group --instance-id i-00000000000000001 "
        "--no-should-decrement-desired-capacity --region us-west-2"]
    after = state(tmp_path)
    assert not after["ip-10-0-1-0.ec2.internal"]["spec"].get("unschedulable")
    assert "ip-10-0-1-1.ec2.internal" not in after
    assert "held in pool gpu-a10g (next batch after the replacements have joined: run again): " \
           "ip-10-0-1-2.ec2.internal" in out
    assert "remediated 1 of 2 node(s); 1 failed" in out


def test_two_nodes_claiming_one_instance_are_both_refused(tmp_path):
    nodes = heron_nodes(1)
    nodes[5]["spec"]["providerID"] = nodes[0]["spec"]["providerID"]   # a healthy node claims the same machine
    result = invoke(tmp_path, nodes, "heron", members=heron_members())
    assert result.exit_code == 1
    assert "node(s) ip-10-0-1-5.ec2.internal claim the same instance" in " ".join(result.stdout.split())
    assert cloud_calls(tmp_path) == []


def test_without_the_stack_output_no_instance_is_replaced(tmp_path):
    (tmp_path / "nodes.json").write_text(json.dumps(heron_nodes(1)))
    (tmp_path / "k.conf").write_text("fake")
    result = CliRunner().invoke(app, ["nodes", "health", "heron", "--clusters", str(ROOT / "clusters"),
                                      "--kubeconfig", str(tmp_path / "k.conf"), "--remediate"],
                                env={"PATH": f"{FAKE_BIN}{os.pathsep}/usr/bin:/bin", "FAKE_NODES":
                                     str(tmp_path / "nodes.json"), "FAKE_CLOUD_LOG": str(tmp_path / "cloud.log")})
    assert result.exit_code == 1
    assert "verified against the stack output nodeGroups: the pulumi CLI is not installed" in \
        " ".join(result.output.split())
    assert cloud_calls(tmp_path) == []
    assert not state(tmp_path)["ip-10-0-1-0.ec2.internal"]["spec"].get("unschedulable")
