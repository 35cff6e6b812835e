"""Cloud GPU pools through `corral upgrade`: a drained, batched replacement.

heron (AWS) upgrades to 1.31.0 with its API servers already there; its two
GPU pools have nodes at 1.30.8, one at 1.31.0 booted from an older pool
template (its corral.dev/template label is not the pool's fingerprint) and
one at 1.31.0 without the label (booted before it existed: judged by its
version). At the process boundary: the fake kubectl
(tests/upgrade/fake_kubectl: nodes with pool labels and provider IDs, pods,
PodDisruptionBudgets that refuse an eviction) and a fake `aws` CLI
(tests/upgrade/fake_cloud: terminating an instance in its Auto Scaling group
launches a replacement Node at the version the group's template boots, in
the same group; it answers which group holds an instance). The stack output
nodeGroups comes as `--outputs FILE`.
Asserted: `--check` prints the batches and the exact cloud commands (the
membership queries too) and changes nothing; each node's instance is
confirmed to be its pool's before anything is touched, and a node whose
providerID names another group's or another region's machine is refused,
untouched, within the failure budget; the nodes are cordoned, drained, terminated without
lowering the desired capacity and deleted one batch at a time, the next
batch only after the replacements are Ready at the target; a second run
does nothing; a drain a PDB refuses lifts corral's cordon and stops the roll
(budget 0), the next run resumes; replacements that never turn Ready stop
the roll with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.model import load_cluster
from corral.upgrade.cloudgpu import pool_templates

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
OLD, NEW = "1.30.8", "1.31.0"
POOLS = {"gpu-a": "gpu-a10g", "gpu-b": "gpu-a10g", "gpu-c": "gpu-a10g", "gpu-x": "gpu-a10g-inference"}


TEMPLATES = pool_templates(load_cluster(ROOT / "clusters" / "heron.yaml"))


def node(pool: str, instance: str, version: str, template: str | None = None) -> dict:
    labels = {"corral.dev/pool": pool, "corral.dev/cluster": "heron"}
    if template:
        labels["corral.dev/template"] = template
    return {"labels": labels, "providerID": f"aws:///us-west-2a/{instance}", "kubeletVersion": f"v{version}",
            "annotations": {}}


# The stack output `pulumi up` exports for heron (tests/infra/test_node_groups_output.py).
STACK_OUTPUTS = {"nodeGroups": {
    pool: [{"provider": "aws", "name": f"heron-{pool}", "region": "us-west-2", "zones": zones}]
    for pool, zones in {"cpu-m7i": ["us-west-2a", "us-west-2b", "us-west-2c"],
                        "gpu-a10g": ["us-west-2a", "us-west-2b"], "gpu-a10g-inference": ["us-west-2a"]}.items()}}


@pytest.fixture
def cloud(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(HERE / "fake_kubectl")
    (bin_dir / "aws").symlink_to(HERE / "fake_cloud")
    state = tmp_path / "kube.json"
    nodes = {name: node(pool, f"i-0{i}", OLD) for i, (name, pool) in enumerate(POOLS.items())}
    nodes["gpu-d"] = node("gpu-a10g", "i-09", NEW)  # at the target, no template label: left alone
    nodes["gpu-e"] = node("gpu-a10g", "i-08", NEW, template="0123456789abcdef")  # an older template
    nodes["gpu-f"] = node("gpu-a10g", "i-07", NEW, template=TEMPLATES["gpu-a10g"])  # current
    nodes["cpu-1"] = node("cpu-m7i", "i-10", OLD)   # a CPU pool: rolled by the provider on `corral up`
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(STACK_OUTPUTS))
    state.write_text(json.dumps({
        "serverVersion": f"v{NEW}", "nodes": nodes,
        # What AWS knows: each instance in its pool's Auto Scaling group.
        "asgInstances": {n["providerID"].rsplit("/", 1)[1]: {"group": f"heron-{n['labels']['corral.dev/pool']}",
                                                              "zone": "us-west-2a"} for n in nodes.values()},
        "pods": [{"name": "train-a", "namespace": "ml", "node": "gpu-a", "labels": {"app": "train"}},
                 {"name": "serve-b", "namespace": "ml", "node": "gpu-b", "labels": {"app": "serve"}},
                 {"name": "serve-d", "namespace": "ml", "node": "gpu-d", "labels": {"app": "serve"}}],
        "pdbs": [{"name": "serve", "namespace": "ml", "selector": {"app": "serve"}, "minAvailable": 1}]}))
    kubeconfig = tmp_path / "admin.kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n# TEST FAKE\n")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", KUBECONFIG=str(kubeconfig),
               FAKE_KUBE_STATE=str(state), FAKE_KUBECTL_LOG=str(tmp_path / "kubectl.jsonl"),
               FAKE_CLOUD_LOG=str(tmp_path / "cloud.jsonl"), FAKE_CLOUD_BOOTS_VERSION=NEW,
               FAKE_CLOUD_TEMPLATES=json.dumps(TEMPLATES), COLUMNS="200")

    class Cloud:
        def run(self, *extra: str, **extra_env) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "corral", "upgrade", "heron", "--to", NEW,
                                   "--clusters", str(ROOT / "clusters"), "--outputs", str(outputs), *extra],
                                  env=env | extra_env, capture_output=True, text=True, timeout=300)

        def state(self) -> dict:
            return json.loads(state.read_text())

        def edit(self, change) -> None:
            data = self.state()
            change(data)
            state.write_text(json.dumps(data))

        def ops(self) -> list[tuple[str, str]]:
            log = tmp_path / "kubectl.jsonl"
            calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
            return [(c["verb"], c["argv"][2] if c["verb"] == "delete" else c["argv"][1]) for c in calls
                    if c.get("verb") in ("cordon", "drain", "uncordon") or c["argv"][:2] == ["delete", "node"]]

        def cloud_calls(self) -> list[list[str]]:
            log = tmp_path / "cloud.jsonl"
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

        def terminated(self) -> list[str]:
            return [c[c.index("--instance-id") + 1] for c in self.cloud_calls()
                    if "terminate-instance-in-auto-scaling-group" in c]

    return Cloud()


def test_check_prints_the_batches_and_commands_and_changes_nothing(cloud):
    result = cloud.run("--check", "--cloud-gpu-batch", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "heron-gpu-a10g" in out and "cloud-gpu-pool" in out
    assert "gpu-a10g batch 1: gpu-a, gpu-b" in out and "gpu-a10g batch 2: gpu-c, gpu-e" in out
    assert "gpu-a10g-inference batch 3: gpu-x" in out and "cpu-1" not in out
    assert "gpu-d" not in out and "gpu-f" not in out
    assert ("gpu-a (runs v1.30.8): verify: aws autoscaling describe-auto-scaling-instances --instance-ids i-00 "
            "--region us-west-2 --output json  (must list i-00 in heron-gpu-a10g)\n"
            "  gpu-a: cordon, drain, aws autoscaling terminate-instance-in-auto-scaling-group "
            "--instance-id i-00 --no-should-decrement-desired-capacity --region us-west-2, delete node") in out
    assert f"gpu-e (template 0123456789abcdef, the pool's is {TEMPLATES['gpu-a10g']})" in out
    assert cloud.ops() == [] and cloud.cloud_calls() == []


def test_gpu_nodes_are_drained_and_replaced_a_batch_at_a_time(cloud):
    cloud.edit(lambda s: s.update(pdbs=[]))
    result = cloud.run("--cloud-gpu-batch", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    ops = cloud.ops()
    assert ops == [("cordon", "gpu-a"), ("drain", "gpu-a"), ("delete", "gpu-a"),
                   ("cordon", "gpu-b"), ("drain", "gpu-b"), ("delete", "gpu-b"),
                   ("cordon", "gpu-c"), ("drain", "gpu-c"), ("delete", "gpu-c"),
                   ("cordon", "gpu-e"), ("drain", "gpu-e"), ("delete", "gpu-e"),
                   ("cordon", "gpu-x"), ("drain", "gpu-x"), ("delete", "gpu-x")], ops
    assert cloud.terminated() == ["i-00", "i-01", "i-02", "i-08", "i-03"]
    # The batch waited for its replacements before the next began.
    waits = [line for line in result.stderr.splitlines() if "replacement(s) Ready" in line]
    assert waits == ["gpu-a10g: wait for 2 replacement(s) Ready at v1.31.0",
                     "gpu-a10g: wait for 2 replacement(s) Ready at v1.31.0",
                     "gpu-a10g-inference: wait for 1 replacement(s) Ready at v1.31.0"]
    state = cloud.state()
    gpu = {n: v for n, v in state["nodes"].items() if v["labels"]["corral.dev/pool"].startswith("gpu")}
    assert len(gpu) == 7 and all(v["kubeletVersion"] == f"v{NEW}" for v in gpu.values())
    assert sorted(v["labels"].get("corral.dev/template", "none") for v in gpu.values()) == sorted(
        [TEMPLATES["gpu-a10g"]] * 5 + [TEMPLATES["gpu-a10g-inference"], "none"])
    assert not any(v.get("unschedulable") or v["annotations"] for v in gpu.values())
    assert state["nodes"]["cpu-1"]["kubeletVersion"] == f"v{OLD}"  # not this roll's
    assert next(p for p in state["pods"] if p["name"] == "train-a")["node"] not in (None, "gpu-a")
    assert "cloud GPU pools: 5 node(s) replaced, 0 failed" in result.stdout

    again = cloud.run("--cloud-gpu-batch", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert cloud.ops() == ops and "cloud GPU pools: every node runs 1.31.0 on its pool's current template" in \
        again.stdout


def test_a_refused_drain_uncordons_and_stops_then_the_next_run_resumes(cloud):
    # serve-b and serve-d are the two replicas of a budget of minAvailable 1: gpu-b
    # drains (serve-b moves), but then a budget that allows none refuses.
    cloud.edit(lambda s: s["pdbs"][0].update(minAvailable=2))
    first = cloud.run("--cloud-gpu-batch", "2", "--max-fail-percentage", "0")
    assert first.returncode == 1
    ops = cloud.ops()
    assert ("drain", "gpu-b") in ops and ("uncordon", "gpu-b") in ops and ("delete", "gpu-b") not in ops
    assert ("cordon", "gpu-c") not in ops, "the roll went on past a failed batch"
    assert cloud.terminated() == ["i-00"]
    state = cloud.state()
    assert not state["nodes"]["gpu-b"].get("unschedulable") and not state["nodes"]["gpu-b"]["annotations"]
    message = " ".join((first.stdout + first.stderr).split())
    assert "gpu-b:" in message and "disruption budget" in message and "run corral upgrade again to resume" in message

    cloud.edit(lambda s: s.update(pdbs=[]))
    second = cloud.run("--cloud-gpu-batch", "2")
    assert second.returncode == 0, second.stdout + second.stderr
    assert cloud.terminated() == ["i-00", "i-01", "i-02", "i-08", "i-03"]


def test_replacements_that_never_turn_ready_stop_the_roll(cloud):
    cloud.edit(lambda s: s.update(pdbs=[]))
    result = cloud.run("--replacement-timeout", "2", FAKE_CLOUD_NEVER_READY="1")
    assert result.returncode == 1
    assert cloud.terminated() == ["i-00"]
    message = " ".join(result.stderr.split())
    assert f"pool gpu-a10g: 2 of 3 nodes Ready at v1.31.0 on template {TEMPLATES['gpu-a10g']} after 2 s" in message
    assert "`corral up` gives it the new one" in message



def test_forged_provider_ids_are_refused_untouched_within_the_failure_budget(cloud):
    """A node naming another group's machine (per AWS), or one in another region, is never drained
    or terminated; the roll counts it as failed and stops when the budget is spent."""
    def forge(state):
        state["pdbs"] = []
        state["asgInstances"]["i-00"]["group"] = "payments-db"                # gpu-a: another group's machine
        state["nodes"]["gpu-b"]["providerID"] = "aws:///us-east-1a/i-0deadbeef"  # gpu-b: another region
    cloud.edit(forge)
    result = cloud.run("--cloud-gpu-batch", "2", "--max-fail-percentage", "0")
    assert result.returncode == 1
    message = " ".join((result.stdout + result.stderr).split())
    assert ("gpu-a: refused node gpu-a (providerID aws:///us-west-2a/i-00): AWS says it is in Auto Scaling group "
            "payments-db (us-west-2a); expected Auto Scaling group heron-gpu-a10g (us-west-2a, us-west-2b) of pool "
            "gpu-a10g") in message
    assert ("gpu-b: refused node gpu-b (providerID aws:///us-east-1a/i-0deadbeef): zone us-east-1a is in no group "
            "of pool gpu-a10g") in message
    assert "pool gpu-a10g: 2 of 2 node(s) of the batch failed (--max-fail-percentage 0)" in message
    assert cloud.ops() == [] and cloud.terminated() == []       # neither cordoned, drained nor terminated
    assert [c[:3] for c in cloud.cloud_calls()] == [["aws", "autoscaling", "describe-auto-scaling-instances"]]
    state = cloud.state()
    assert not state["nodes"]["gpu-a"].get("unschedulable") and not state["nodes"]["gpu-b"].get("unschedulable")

    # A budget that allows it: the forged nodes are held, the pool's real ones replaced.
    second = cloud.run("--cloud-gpu-batch", "1", "--max-fail-percentage", "100")
    assert second.returncode == 1              # the refused nodes still count as failed
    assert cloud.terminated() == ["i-02", "i-08", "i-03"]
    assert "cloud GPU pools: 3 node(s) replaced, 2 failed" in second.stdout
