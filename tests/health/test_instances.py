"""A node's providerID is a claim: corral acts only on an instance of this cluster's pool.

The stack output nodeGroups below is what `pulumi up` exports for heron
(AWS), ibis (GCP) and an Azure cluster (tests/infra/test_node_groups_output.py
holds the program to that shape). The clouds' membership queries run against
the fake CLIs at the process boundary (tests/health/fake_bin/fake_cloud),
which know the instances listed in $FAKE_CLOUD_MEMBERS.
"""

from __future__ import annotations

import json
import os

import pytest

from corral.health.instances import (
    InstanceRefused,
    match,
    membership_command,
    parse_node_groups,
    planned_commands,
    read_node_groups,
    replace_command,
    verify,
)
from corral.health.kube import HealthError

from .conftest import FAKE_BIN

SUB = "0b6f6c1e-2d3a-4c5b-9e8f-7a6b5c4d3e2f"
NODE_GROUPS = parse_node_groups({
    "gpu-a10g": [{"provider": "aws", "name": "heron-gpu-a10g", "region": "us-west-2",
                  "zones": ["us-west-2a", "us-west-2b"]}],
    "gpu-a10g-inference": [{"provider": "aws", "name": "heron-gpu-a10g-inference", "region": "us-west-2",
                            "zones": ["us-west-2a"]}],
    "gpu-a100": [{"provider": "gcp", "name": f"ibis-gpu-a100-{z}", "region": "us-central1",
                  "zones": [f"us-central1-{z}"], "project": "corral-ibis"} for z in "ac"],
    "gpu-l4": [{"provider": "gcp", "name": f"ibis-gpu-l4-{z}", "region": "us-central1",
                "zones": [f"us-central1-{z}"], "project": "corral-ibis"} for z in "abc"],
    "gpu-nd": [{"provider": "azure", "name": f"kestrel-gpu-nd-{z}", "region": "eastus2", "zones": [z],
                "subscription": SUB, "resourceGroup": "kestrel-rg"} for z in "12"],
}, "test")
VMSS_ID = ("azure:///subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/"
           "virtualMachineScaleSets/{vmss}/virtualMachines/{n}")


@pytest.fixture
def clouds(tmp_path, monkeypatch):
    """The fake CLIs on PATH; `clouds.know(...)` lists an instance the clouds know."""
    members: list[dict] = []
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CLOUD_MEMBERS", str(tmp_path / "members.json"))
    monkeypatch.setenv("FAKE_CLOUD_LOG", str(tmp_path / "cloud.log"))

    class Clouds:
        def know(self, **instance) -> None:
            members.append(instance)
            (tmp_path / "members.json").write_text(json.dumps(members))

        def calls(self) -> list[str]:
            log = tmp_path / "cloud.log"
            return log.read_text().splitlines() if log.exists() else []

    (tmp_path / "members.json").write_text("[]")
    return Clouds()


# --- Matching the claim to the stack (no cloud call) ---------------------------------------


def test_a_forged_project_is_refused_naming_node_id_and_what_was_expected():
    forged = "gce://other-project/us-central1-a/db-primary-mig-x7k2"
    with pytest.raises(InstanceRefused) as refused:
        match("gcp", "gpu-a100-x", "gpu-a100", forged, NODE_GROUPS)
    message = str(refused.value)
    assert message.startswith(f"refused node gpu-a100-x (providerID {forged}): project other-project is not "
                              "this cluster's; expected an instance of project corral-ibis, region us-central1, ")
    assert "MIG ibis-gpu-a100-a (us-central1-a) or MIG ibis-gpu-a100-c (us-central1-c) of pool gpu-a100" in message


def test_the_right_project_but_another_pools_mig_is_refused():
    with pytest.raises(InstanceRefused, match="instance ibis-gpu-l4-a-x7k2 in us-central1-a is in no MIG of "
                                              "pool gpu-a100"):
        match("gcp", "n1", "gpu-a100", "gce://corral-ibis/us-central1-a/ibis-gpu-l4-a-x7k2", NODE_GROUPS)
    # ... and a zone the pool has no MIG in (gpu-a100 runs in a and c only)
    with pytest.raises(InstanceRefused, match="in no MIG of pool gpu-a100"):
        match("gcp", "n1", "gpu-a100", "gce://corral-ibis/us-central1-b/ibis-gpu-a100-b-x7k2", NODE_GROUPS)


@pytest.mark.parametrize(("cloud", "provider_id", "pool"), [
    ("gcp", "gce://corral-ibis/us-east1-b/ibis-gpu-a100-a-x7k2", "gpu-a100"),
    ("aws", "aws:///us-east-1a/i-0abc123def4567890", "gpu-a10g"),
    ("aws", "aws:///us-west-2c/i-0abc123def4567890", "gpu-a10g"),     # right region, not a pool zone
])
def test_another_region_or_zone_is_refused(cloud, provider_id, pool):
    with pytest.raises(InstanceRefused, match=f"refused node n1 \\(providerID {provider_id}\\): .*in no "):
        match(cloud, "n1", pool, provider_id, NODE_GROUPS)


def test_an_azure_scale_set_of_another_resource_group_or_subscription_is_refused():
    other_rg = VMSS_ID.format(sub=SUB, rg="payments-rg", vmss="kestrel-gpu-nd-1", n=3)
    with pytest.raises(InstanceRefused, match="resource group payments-rg is not this cluster's; expected an "
                                              f"instance of subscription {SUB}, resource group kestrel-rg"):
        match("azure", "n1", "gpu-nd", other_rg, NODE_GROUPS)
    other_sub = VMSS_ID.format(sub="11111111-2222-3333-4444-555555555555", rg="kestrel-rg",
                               vmss="kestrel-gpu-nd-1", n=3)
    with pytest.raises(InstanceRefused, match="subscription 11111111-2222-3333-4444-555555555555 is not"):
        match("azure", "n1", "gpu-nd", other_sub, NODE_GROUPS)
    other_set = VMSS_ID.format(sub=SUB, rg="kestrel-rg", vmss="kestrel-cpu-1", n=3)
    with pytest.raises(InstanceRefused, match="scale set kestrel-cpu-1 is not one of pool gpu-nd"):
        match("azure", "n1", "gpu-nd", other_set, NODE_GROUPS)


def test_a_pool_label_the_stack_does_not_know_and_a_shared_instance_are_refused():
    with pytest.raises(InstanceRefused, match="has no aws group of pool db-primary"):
        match("aws", "n1", "db-primary", "aws:///us-west-2a/i-0abc", NODE_GROUPS)
    claims = {"n1": "aws:///us-west-2a/i-0abc", "n2": "aws:///us-west-2a/i-0abc", "n3": "aws:///us-west-2a/i-0def"}
    with pytest.raises(InstanceRefused, match="node\\(s\\) n2 claim the same instance"):
        match("aws", "n1", "gpu-a10g", claims["n1"], NODE_GROUPS, claims)


def test_commands_come_from_the_stack_not_the_node():
    # Azure returns resource groups lower-cased in IDs; the commands use the stack's spelling.
    target = match("azure", "n1", "gpu-nd", VMSS_ID.format(sub=SUB.upper(), rg="KESTREL-RG",
                                                           vmss="kestrel-gpu-nd-2", n=17), NODE_GROUPS)
    assert replace_command(target) == ["az", "vmss", "delete-instances", "--subscription", SUB, "--resource-group",
                                       "kestrel-rg", "--name", "kestrel-gpu-nd-2", "--instance-ids", "17"]
    assert membership_command(target) == ["az", "vmss", "show", "--subscription", SUB, "--resource-group",
                                          "kestrel-rg", "--name", "kestrel-gpu-nd-2", "--instance-id", "17",
                                          "--output", "json"]
    target = match("gcp", "n1", "gpu-a100", "gce://corral-ibis/us-central1-c/ibis-gpu-a100-c-x7k2", NODE_GROUPS)
    assert replace_command(target) == [
        "gcloud", "compute", "instance-groups", "managed", "recreate-instances", "ibis-gpu-a100-c",
        "--instances=ibis-gpu-a100-c-x7k2", "--zone=us-central1-c", "--project=corral-ibis", "--quiet"]
    target = match("aws", "n1", "gpu-a10g", "aws:///us-west-2b/i-0abc123def4567890", NODE_GROUPS)
    assert replace_command(target) == [
        "aws", "autoscaling", "terminate-instance-in-auto-scaling-group", "--instance-id", "i-0abc123def4567890",
        "--no-should-decrement-desired-capacity", "--region", "us-west-2"]


@pytest.mark.parametrize(("provider_id", "why"), [
    ("", "cannot find the machine"), ("aws:///us-east-1b/i-0abc; rm -rf /", "cannot find the machine"),
    ("kind://docker/kind/kind-worker", "cannot find the machine"),
    ("gce://corral-ibis/us-central1-a/name", "in no MIG of pool"),   # no MIG's base instance name
])
def test_an_id_that_names_no_scale_group_instance_is_refused(provider_id, why):
    cloud, pool = ("aws", "gpu-a10g") if provider_id.startswith("aws") else ("gcp", "gpu-a100")
    with pytest.raises(InstanceRefused, match=why):
        match(cloud, "n1", pool, provider_id, NODE_GROUPS)


# --- Confirmed by the cloud, read-only -----------------------------------------------------


def test_an_aws_instance_in_another_auto_scaling_group_is_refused_by_the_api(clouds):
    clouds.know(cloud="aws", instance="i-0abc123def4567890", group="payments-db", zone="us-west-2a")
    with pytest.raises(InstanceRefused, match="AWS says it is in Auto Scaling group payments-db \\(us-west-2a\\); "
                                              "expected Auto Scaling group heron-gpu-a10g"):
        verify("aws", "n1", "gpu-a10g", "aws:///us-west-2a/i-0abc123def4567890", NODE_GROUPS)
    assert clouds.calls() == ["aws autoscaling describe-auto-scaling-instances --instance-ids i-0abc123def4567890 "
                              "--region us-west-2 --output json"]


def test_an_instance_the_account_does_not_know_is_refused(clouds):
    # Another account's instance: AWS ignores the unknown ID and lists nothing.
    with pytest.raises(InstanceRefused, match="AWS knows no Auto Scaling instance i-0abc in this account's us-west-2"):
        verify("aws", "n1", "gpu-a10g", "aws:///us-west-2a/i-0abc", NODE_GROUPS)


def test_gcp_and_azure_members_are_confirmed_and_strangers_refused(clouds):
    clouds.know(cloud="gcp", project="corral-ibis", zone="us-central1-a", group="ibis-gpu-a100-a",
                instance="ibis-gpu-a100-a-x7k2")
    clouds.know(cloud="azure", subscription=SUB, resourceGroup="kestrel-rg", group="kestrel-gpu-nd-1", instance="3")
    target = verify("gcp", "n1", "gpu-a100", "gce://corral-ibis/us-central1-a/ibis-gpu-a100-a-x7k2", NODE_GROUPS)
    assert target.group.name == "ibis-gpu-a100-a"
    # Named like the MIG's instances, but not one of them (the MIG lists only x7k2).
    with pytest.raises(InstanceRefused, match="MIG ibis-gpu-a100-a in us-central1-a has no instance "
                                              "ibis-gpu-a100-a-zzzz \\(1 member\\(s\\)\\)"):
        verify("gcp", "n2", "gpu-a100", "gce://corral-ibis/us-central1-a/ibis-gpu-a100-a-zzzz", NODE_GROUPS)
    assert verify("azure", "n3", "gpu-nd", VMSS_ID.format(sub=SUB, rg="kestrel-rg", vmss="kestrel-gpu-nd-1", n=3),
                  NODE_GROUPS).claim.instance == "3"
    with pytest.raises(InstanceRefused, match="az vmss show ... exit 3: \\(ResourceNotFound\\)"):
        verify("azure", "n4", "gpu-nd", VMSS_ID.format(sub=SUB, rg="kestrel-rg", vmss="kestrel-gpu-nd-1", n=4),
               NODE_GROUPS)
    assert not [c for c in clouds.calls() if "recreate" in c or "delete-instances" in c]


def test_check_shows_the_membership_query_or_why_a_node_is_refused():
    membership, replace = planned_commands("aws", "n1", "gpu-a10g", "aws:///us-west-2a/i-0abc", NODE_GROUPS)
    assert membership == ("aws autoscaling describe-auto-scaling-instances --instance-ids i-0abc --region us-west-2 "
                          "--output json  (must list i-0abc in heron-gpu-a10g)")
    assert replace.startswith("aws autoscaling terminate-instance-in-auto-scaling-group --instance-id i-0abc")
    refused, nothing = planned_commands("gcp", "n1", "gpu-a100", "gce://other-project/us-central1-a/x-1",
                                        NODE_GROUPS)
    assert refused.startswith("(refused: refused node n1") and nothing == ""
    unreadable, nothing = planned_commands("aws", "n1", "gpu-a10g", "aws:///us-west-2a/i-0abc",
                                           HealthError("the pulumi CLI is not installed"))
    assert unreadable == "(refused: the pulumi CLI is not installed)" and nothing == ""


# --- Reading the stack output -------------------------------------------------------------


def test_the_outputs_file_is_read_and_bad_input_named_by_file_and_field(tmp_path):
    good = tmp_path / "outputs.json"
    good.write_text(json.dumps({"apiEndpoint": "10.0.0.5:6443", "nodeGroups": {
        "gpu-a10g": [{"provider": "aws", "name": "heron-gpu-a10g", "region": "us-west-2", "zones": ["us-west-2a"]}]}}))
    assert read_node_groups("heron", good)["gpu-a10g"][0].name == "heron-gpu-a10g"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodeGroups": {"gpu-a100": [{"provider": "gcp", "name": "m", "region": "r",
                                                            "zones": ["z"]}]}}))
    with pytest.raises(HealthError, match=f"{bad}: nodeGroups.gpu-a100.0: Value error, a gcp group needs project"):
        read_node_groups("ibis", bad)
    bad.write_text(json.dumps({"nodeGroups": {"p": [{"provider": "aws", "name": "g", "zones": ["z"]}]}}))
    with pytest.raises(HealthError, match=f"{bad}: nodeGroups.p.0.region: Field required"):
        read_node_groups("heron", bad)
    bad.write_text('{"nodeGroups": {\n  "p": [,]}}')
    with pytest.raises(HealthError, match=f"{bad}:2:9: not JSON"):
        read_node_groups("heron", bad)
    bad.write_text(json.dumps({"apiEndpoint": "10.0.0.5:6443"}))
    with pytest.raises(HealthError, match="no stack output nodeGroups"):
        read_node_groups("heron", bad)


def test_without_outputs_file_the_stack_is_asked(tmp_path, monkeypatch):
    fake_pulumi = tmp_path / "pulumi"
    fake_pulumi.write_text("#!/bin/sh\n# TEST FAKE: pulumi, at the process boundary\n"
                           f"echo \"$*\" >> {tmp_path}/pulumi.log\n"
                           "echo '{\"gpu-a10g\": []}'\n")
    fake_pulumi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert read_node_groups("heron", None) == {"gpu-a10g": []}
    assert (tmp_path / "pulumi.log").read_text() == "stack output nodeGroups --json -s heron\n"
