"""Node identity, cloud pools (issue 25, item 4): corral-node-approver approves a pool token's
kubelet client certificate for a cloud pool only when the cloud's API says an instance of
that name is running in one of that pool's groups.

The cloud is a fake HTTPS cloud with fake metadata services at the network boundary
(tests/health/fake_cloud.py), asked through the approver's own client
(corral/health/cloud_api.py) with the configuration rendered for the example clusters; the
loop runs against the fake API server (tests/certs/fake_csr_apiserver.py).
"""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager

import pytest

from corral.certs import node_approver as approver
from corral.health import cloud_api
from corral.manifests import node_approver as addon
from corral.manifests.policy import autoscaler_node_groups
from corral.nodes.join import pool_token_group
from tests.certs.fake_csr_apiserver import FakeCsrApiServer
from tests.certs.test_node_approver import FLEET, HERON, JAGUAR, ROBOTICS, csr
from tests.health.fake_cloud import FakeCloudApi, FakeInstance, FakeMetadata

INFERENCE = pool_token_group("gpu-a10g-inference")   # heron ASG heron-gpu-a10g-inference (us-west-2a)
SHARED_A10G = pool_token_group("gpu-a10g")           # heron ASG heron-gpu-a10g (us-west-2a, us-west-2b)
AZURE_CPU = pool_token_group("cpu-d64")              # jaguar scale sets jaguar-cpu-d64-1..3

MEMBER = "ip-10-20-3-4.us-west-2.compute.internal"
STOPPED = "ip-10-20-3-5.us-west-2.compute.internal"
OTHER_POOLS = "ip-10-20-9-9.us-west-2.compute.internal"
INSTANCES = [
    FakeInstance("aws", "heron-gpu-a10g-inference", MEMBER, "i-0aaa", "us-west-2a"),
    FakeInstance("aws", "heron-gpu-a10g-inference", STOPPED, "i-0bbb", "us-west-2a", state="stopped"),
    FakeInstance("aws", "heron-gpu-a10g", OTHER_POOLS, "i-0ccc", "us-west-2b"),
    # In the pool's ASG but in a zone the pool was never given.
    FakeInstance("aws", "heron-gpu-a10g-inference", "ip-10-20-7-7.us-west-2.compute.internal", "i-0ddd", "us-west-2c"),
    FakeInstance("gcp", "ibis-gpu-l4-b", "ibis-gpu-l4-b-x7k2", "8841", "us-central1-b", state="RUNNING"),
    FakeInstance("gcp", "ibis-gpu-l4-c", "ibis-gpu-l4-c-stop", "8842", "us-central1-c", state="STOPPING"),
    FakeInstance("azure", "jaguar-cpu-d64-2", "jaguar-cpu-d64-2-0a1b2c", "7", "2", state="PowerState/running"),
    # A scale set of another resource group (another cluster's, same name).
    FakeInstance("azure", "jaguar-cpu-d64-3", "jaguar-cpu-d64-3-0a1b2c", "1", "3", state="PowerState/running",
                 resource_group="someone-elses-rg"),
]


@contextmanager
def fake_cloud(tmp_path, provider: str):
    """The fake cloud and a CloudMembership asking it as the approver would (its own session)."""
    folder = tmp_path / "fake-cloud"   # its CA apart from the fake API server's
    folder.mkdir(exist_ok=True)
    with FakeCloudApi(folder, copy.deepcopy(INSTANCES)) as api, FakeMetadata(provider) as metadata:
        yield api, metadata, lambda config, **kw: approver.CloudMembership(
            config, session=cloud_api.CloudSession(provider, metadata_url=metadata.url, **api.session_args()), **kw)


def decide(cluster, request, membership, existing=()):
    return approver.decide(request, addon.config(cluster), lambda name: name in existing, membership)


def test_a_running_instance_of_the_pools_group_is_approved(tmp_path):
    config = addon.config(HERON)
    with fake_cloud(tmp_path, "aws") as (api, _, membership_for):
        decision = decide(HERON, csr(MEMBER, [INFERENCE]), membership_for(config))
    assert decision.approve and decision.reason == "CorralPoolMember" and decision.pool == "gpu-a10g-inference"
    assert "i-0aaa" in decision.message and "heron-gpu-a10g-inference" in decision.message
    assert api.calls == [("aws", "DescribeInstances")]


@pytest.mark.parametrize("node, reason, says", [
    ("ip-10-20-99-1.us-west-2.compute.internal", "NoCloudInstance", "no instance named"),   # no such machine
    (OTHER_POOLS, "NoCloudInstance", "heron-gpu-a10g-inference"),   # another pool's ASG: same name rule on AWS
    (STOPPED, "InstanceNotRunning", "i-0bbb in heron-gpu-a10g-inference: stopped"),
    ("ip-10-20-7-7.us-west-2.compute.internal", "InstanceNotRunning", "i-0ddd"),   # outside the pool's zones
])
def test_a_name_the_cloud_does_not_place_running_in_the_pools_group_is_denied(tmp_path, node, reason, says):
    with fake_cloud(tmp_path, "aws") as (_, _, membership_for):
        decision = decide(HERON, csr(node, [INFERENCE]), membership_for(addon.config(HERON)))
    assert not decision.approve and decision.reason == reason, decision
    assert says in decision.message


def test_an_instance_of_another_pool_is_approved_only_for_that_pools_token(tmp_path):
    config = addon.config(HERON)
    with fake_cloud(tmp_path, "aws") as (_, _, membership_for):
        membership = membership_for(config)
        assert not decide(HERON, csr(OTHER_POOLS, [INFERENCE]), membership).approve
        own = decide(HERON, csr(OTHER_POOLS, [SHARED_A10G]), membership)
    assert own.approve and own.pool == "gpu-a10g"


@pytest.mark.parametrize("status", [403, 500, 503])
def test_a_cloud_api_error_denies_with_a_clear_message(tmp_path, status):
    with fake_cloud(tmp_path, "aws") as (api, _, membership_for):
        api.fail = status
        decision = decide(HERON, csr(MEMBER, [INFERENCE]), membership_for(addon.config(HERON)))
    assert not decision.approve and decision.reason == "CloudApiError"
    assert f"HTTP {status}" in decision.message and "never approved on a name alone" in decision.message


def test_no_metadata_service_denies(tmp_path):
    """The pod without the host's network (or a cloud outage of the metadata service)."""
    with FakeCloudApi(tmp_path, []) as api:
        session = cloud_api.CloudSession("aws", metadata_url="http://127.0.0.1:9", **api.session_args())
        decision = decide(HERON, csr(MEMBER, [INFERENCE]), approver.CloudMembership(addon.config(HERON), session))
    assert not decision.approve and decision.reason == "CloudApiError" and "IMDSv2 token" in decision.message
    assert api.calls == []


def test_without_a_cloud_check_no_cloud_name_is_approved():
    decision = approver.decide(csr(MEMBER, [INFERENCE]), addon.config(HERON), lambda name: False)
    assert not decision.approve and decision.reason == "CloudCheckUnavailable"


def test_azure_scale_set_members_of_this_resource_group_only(tmp_path):
    config = addon.config(JAGUAR)
    with fake_cloud(tmp_path, "azure") as (api, _, membership_for):
        membership = membership_for(config)
        assert decide(JAGUAR, csr("jaguar-cpu-d64-2-0a1b2c", [AZURE_CPU]), membership).approve
        # The name rule fits (a zone's scale set), but no such instance in this cluster's resource group.
        other = decide(JAGUAR, csr("jaguar-cpu-d64-3-0a1b2c", [AZURE_CPU]), membership)
        missing = decide(JAGUAR, csr("jaguar-cpu-d64-1-zzzzzz", [AZURE_CPU]), membership)
    assert not other.approve and other.reason == "NoCloudInstance"
    assert not missing.approve and missing.reason == "NoCloudInstance"
    assert {operation for _, operation in api.calls} == {"virtualMachines"}


def test_gcp_mig_members_running_only(tmp_path):
    ibis = FLEET.clusters["ibis"]
    l4 = pool_token_group("gpu-l4")
    with fake_cloud(tmp_path, "gcp") as (api, _, membership_for):
        membership = membership_for(addon.config(ibis))
        approved = decide(ibis, csr("ibis-gpu-l4-b-x7k2", [l4]), membership)
        stopping = decide(ibis, csr("ibis-gpu-l4-c-stop", [l4]), membership)
        missing = decide(ibis, csr("ibis-gpu-l4-a-zzzz", [l4]), membership)
    assert approved.approve and approved.pool == "gpu-l4" and "8841" not in approved.message
    assert "ibis-gpu-l4-b-x7k2 of ibis-gpu-l4-b (us-central1-b)" in approved.message
    assert (stopping.reason, missing.reason) == ("InstanceNotRunning", "NoCloudInstance")
    # Each decision asked only the MIG the name is of (not the pool's other zones'), and read only.
    assert api.calls == [("gcp", "listManagedInstances")] * 3


def test_on_prem_pools_keep_the_name_rule_and_never_ask_the_cloud(tmp_path):
    with fake_cloud(tmp_path, "azure") as (api, metadata, membership_for):
        decision = decide(JAGUAR, csr("gpu-070.sf1.internal", [ROBOTICS]), membership_for(addon.config(JAGUAR)))
    assert decision.approve and decision.pool == "gpu-h100-robotics"
    assert api.calls == [] and metadata.requests == []


def test_answers_are_kept_briefly_per_name(tmp_path):
    now = [1000.0]
    with fake_cloud(tmp_path, "aws") as (api, _, membership_for):
        membership = membership_for(addon.config(HERON), clock=lambda: now[0])
        for _ in range(3):
            assert membership("gpu-a10g-inference", MEMBER).approve
        assert not membership("gpu-a10g-inference", STOPPED).approve
        assert len(api.calls) == 2   # one per name
        now[0] += approver.MEMBERSHIP_CACHE_SECONDS + 1
        assert membership("gpu-a10g-inference", MEMBER).approve
        assert len(api.calls) == 3   # asked again once the answer is old
        api.fail = 503
        now[0] += approver.MEMBERSHIP_CACHE_SECONDS + 1
        assert membership("gpu-a10g-inference", MEMBER).reason == "CloudApiError"
        api.fail = None
        assert membership("gpu-a10g-inference", MEMBER).approve   # a failure is never kept
    assert membership.counts == {"CloudInstance": 5, "InstanceNotRunning": 1, "CloudApiError": 1}


def test_the_configuration_names_each_cloud_pools_groups_as_the_autoscaler_does():
    for cluster in (HERON, JAGUAR):
        config = addon.config(cluster)
        assert config["cloud"] == cluster.control_plane.cloud
        for pool in cluster.node_pools:
            entry = config["pools"][pool.name]
            if pool.provider == "onprem":
                assert "groups" not in entry
                continue
            expected = sorted(g.name for g in autoscaler_node_groups(cluster) if g.pool == pool.name)
            assert sorted(g["name"] for g in entry["groups"]) == expected
            assert sorted(z for g in entry["groups"] for z in g["zones"]) == sorted(
                pool.zones or cluster.control_plane.zones)
            assert {g["region"] for g in entry["groups"]} == {cluster.control_plane.region}
    assert "cloud_api.py" in addon.files(HERON)


def test_one_round_asks_the_cloud_read_only_and_records_each_decision(tmp_path, monkeypatch):
    """The loop with the fake API server and the fake cloud: approvals, denials with their
    reasons in the CSR's condition and an Event, and only read calls reach the cloud."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    requests = [csr(MEMBER, [INFERENCE], name="member"), csr(OTHER_POOLS, [INFERENCE], name="other-pool"),
                csr(STOPPED, [INFERENCE], name="stopped"), csr("ip-10-20-99-1", [INFERENCE], name="no-instance"),
                csr("heron-apiserver-0", [INFERENCE], name="api-server")]
    with FakeCsrApiServer(tmp_path, "t", requests, []) as kube, fake_cloud(tmp_path, "aws") as (
            api, _, membership_for):
        (sa / "ca.crt").write_bytes(kube.ca.read_bytes())
        for key, value in {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(kube.port),
                           "CORRAL_SA_DIR": str(sa)}.items():
            monkeypatch.setenv(key, value)
        config = json.loads(addon.files(HERON)["config.json"])
        approver.once(approver.Api(), config, membership_for(config))
        outcome = {name: [(c["type"], c["reason"]) for c in kube.csrs[name]["status"].get("conditions", [])]
                   for name in kube.csrs}
        messages = {name: kube.csrs[name]["status"]["conditions"][0]["message"] for name in kube.csrs}
        events = {(e["involvedObject"]["name"], e["type"], e["reason"]) for e in kube.events}
    assert outcome == {"member": [("Approved", "CorralPoolMember")], "other-pool": [("Denied", "NoCloudInstance")],
                       "stopped": [("Denied", "InstanceNotRunning")], "no-instance": [("Denied", "NoCloudInstance")],
                       "api-server": [("Denied", "ReservedName")]}
    assert "i-0aaa" in messages["member"] and "stopped" in messages["stopped"]
    assert events == {("member", "Normal", "CorralPoolMember"), ("other-pool", "Warning", "NoCloudInstance"),
                      ("stopped", "Warning", "InstanceNotRunning"), ("no-instance", "Warning", "NoCloudInstance"),
                      ("api-server", "Warning", "ReservedName")}
    # Read calls only: never a terminate, and the reserved name never reached the cloud.
    assert api.calls == [("aws", "DescribeInstances")] * 4
    assert {operation for _, operation in api.calls} <= {"DescribeInstances", "listManagedInstances", "virtualMachines"}
