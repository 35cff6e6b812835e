"""The repair controller's metrics port between API servers, on every cloud (issue 27 item 2).

With a cloud GPU pool the controller runs on the API servers' host network and serves /metrics on
the node's own address, port 9402 (corral/manifests/repair.py). The global Prometheus, on one API
server, must reach the replicas on the others, the leader among them, or
`GPURepairCircuitBreakerOpen` can miss it. So each cloud's firewall admits 9402/tcp from the API
servers to the API servers, nothing wider; and only where the controller runs there
(policy.repair_on_api_servers): not for GPU pools on-prem only, not with
`health.remediation.cloud: none`. Each cloud's plan is built under Pulumi's mocks with the helpers of
its own test module.
"""

from __future__ import annotations

import copy

import pulumi
import pytest

from corral.manifests.policy import repair_on_api_servers
from corral.manifests.repair_metrics import METRICS_PORT
from tests.infra import test_aws as aws_plans
from tests.infra import test_azure as azure_plans
from tests.infra import test_gcp as gcp_plans

ONPREM_GPU_POOL = {
    "name": "gpu-h100-lab", "provider": "onprem", "site": "lab",
    "hosts": ["gpu-[001:004].lab.internal"],
    "gpu": {"model": "H100", "count": 8, "driver": "550.127.05", "fabricManager": True},
}


def onprem_gpus_only(data: dict) -> None:
    """The cluster's cloud GPU pools gone (and their reservations); its GPUs in an on-prem site."""
    cloud_gpu = {p["name"] for p in data["nodePools"] if p.get("gpu") and p["provider"] != "onprem"}
    data["nodePools"] = [p for p in data["nodePools"] if p["name"] not in cloud_gpu]
    for team in data.get("scheduling", {}).get("teams", []):
        team["reservedPools"] = [name for name in team.get("reservedPools", []) if name not in cloud_gpu]
    if not any(p.get("gpu") for p in data["nodePools"]):
        data.setdefault("sites", []).append({"name": "lab", "cidrs": ["10.60.0.0/16"],
                                             "vpn": {"peerAddress": "198.51.100.40", "bgpASN": 65040}})
        # A jumbo or cloud-sized MTU does not cross the VPN; the model's default fits it (corral/model/mtu.py).
        data["network"]["flannel"].pop("mtu", None)
        data["nodePools"].append(copy.deepcopy(ONPREM_GPU_POOL))


def no_cloud_remediation(data: dict) -> None:
    data.setdefault("health", {}).setdefault("remediation", {})["cloud"] = "none"


# --- AWS: security group rules ------------------------------------------------


def aws_repair_rules(change=None) -> tuple[aws_plans.Plan, list]:
    plan = aws_plans.build(aws_plans.heron_with(change))
    rules = [r for r in aws_plans._rules(plan) if r.inputs["ipProtocol"] != "icmp"
             and aws_plans._covers(r, METRICS_PORT)]
    return plan, rules


def test_aws_admits_the_metrics_port_from_the_api_servers_to_the_api_servers_only():
    plan, rules = aws_repair_rules()
    assert repair_on_api_servers(plan.cluster)
    assert [r.name for r in rules] == ["heron-api-repair-metrics-api"]
    (rule,) = rules
    assert (rule.inputs["ipProtocol"], rule.inputs["fromPort"], rule.inputs["toPort"]) == ("tcp", 9402, 9402)
    assert aws_plans._group_name(plan, rule) == "heron-api"
    assert "cidrIpv4" not in rule.inputs
    assert plan.by_id(rule.inputs["referencedSecurityGroupId"]).name == "heron-api"


@pytest.mark.parametrize("change", [onprem_gpus_only, no_cloud_remediation])
def test_aws_has_no_metrics_rule_where_the_controller_stays_off_the_api_servers(change):
    plan, rules = aws_repair_rules(change)
    assert not repair_on_api_servers(plan.cluster)
    assert rules == []


# --- GCP: firewall rules --------------------------------------------------------


def gcp_repair_rules(tmp_path, change=None) -> tuple[object, list[dict]]:
    cluster = gcp_plans.load_variant(tmp_path, change)
    recorder, _ = gcp_plans.run(gcp_plans.full_program(cluster))
    rules = [r for r in gcp_plans.firewall_rules(recorder).values() if gcp_plans.opens(r, "tcp", METRICS_PORT)]
    return cluster, rules


def test_gcp_admits_the_metrics_port_from_the_api_servers_to_the_api_servers_only(tmp_path):
    cluster, rules = gcp_repair_rules(tmp_path)
    assert repair_on_api_servers(cluster)
    assert [r["name"] for r in rules] == ["ibis-repair-metrics"]
    (rule,) = rules
    assert rule["allows"] == [{"protocol": "tcp", "ports": ["9402"]}]
    assert rule["sourceTags"] == ["apiserver"] and rule["targetTags"] == ["apiserver"]
    assert not rule.get("sourceRanges")
    assert rule["direction"] == "INGRESS"


@pytest.mark.parametrize("change", [onprem_gpus_only, no_cloud_remediation])
def test_gcp_has_no_metrics_rule_where_the_controller_stays_off_the_api_servers(tmp_path, change):
    cluster, rules = gcp_repair_rules(tmp_path, change)
    assert not repair_on_api_servers(cluster)
    assert rules == []


# --- Azure: network security group rules -----------------------------------------


AZURE_GPU_POOL = {"name": "gpu-a100", "provider": "azure", "machineType": "Standard_NC24ads_A100_v4",
                  "minSize": 0, "maxSize": 16, "gpu": {"model": "A100", "count": 1}}


def azure_repair_rules(**edits) -> tuple[azure_plans.Plan, list[tuple[str, dict]]]:
    # A cloud GPU pool needs an image with the NVIDIA driver (azure common.node_image refuses one without).
    pulumi.runtime.set_all_config({"corral:gpuNodeImage": azure_plans.GPU_IMAGE_ID})
    try:
        plan = azure_plans.plan_of("jaguar", **edits)
    finally:
        pulumi.runtime.set_all_config({})
    opened = [(nsg, rule) for nsg, rules in azure_plans._rules(plan).items() for rule in rules
              if rule["access"] == "Allow" and rule["protocol"] != "Icmp"
              and (ports := azure_plans._ports(rule)) is not None and METRICS_PORT in ports]
    return plan, opened


def test_azure_admits_the_metrics_port_from_the_api_servers_to_the_api_servers_only():
    plan, opened = azure_repair_rules(pools=azure_plans.add_pools(AZURE_GPU_POOL))
    assert repair_on_api_servers(plan.ctx.cluster)
    assert [(nsg, rule["name"]) for nsg, rule in opened] == [("jaguar-control-nsg", "allow-repair-metrics")]
    (_, rule), = opened
    api_hosts = {f"{m.ip}/32" for m in plan.ctx.layout.api_servers}
    assert (rule["protocol"], azure_plans._ports(rule), rule["direction"]) == ("Tcp", {9402}, "Inbound")
    assert set(azure_plans._prefixes(rule, "source")) == api_hosts
    assert set(azure_plans._prefixes(rule, "destination")) == api_hosts


def test_azure_has_no_metrics_rule_where_the_controller_stays_off_the_api_servers():
    # jaguar's GPU pools are on-prem only; with a cloud GPU pool and `remediation.cloud: none` the
    # controller replaces nothing either.
    for edits in ({}, {"pools": azure_plans.add_pools(AZURE_GPU_POOL), "remediation": no_cloud_remediation}):
        plan, opened = azure_repair_rules(**edits)
        assert not repair_on_api_servers(plan.ctx.cluster)
        assert opened == []
