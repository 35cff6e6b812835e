"""Which cloud instance a Node names, and whether corral may take it away.

A Node writes its own `spec.providerID`: the kubelet's `--provider-id`, set
by the machine (corral-provider-id at boot), and any machine holding a
pool's bootstrap token can register a Node claiming any ID, say
`gce://other-project/us-central1-a/db-primary-mig-x7k2`. So the ID is a
claim, never an address corral acts on with the operator's cloud login.
Before remediation replaces a node's machine (corral.health.remediate) or
the upgrade roll of cloud GPU pools does (corral.upgrade.cloudgpu), corral
acts only on an instance that

1. the providerID places in this cluster's project (GCP) / subscription and
   resource group (Azure) / region, in a zone of one of the groups of the
   node's own pool (its `corral.dev/pool` label), as the stack output
   `nodeGroups` names them (corral/infra/outputs.py: written by `pulumi up`,
   not by any node);
2. no other Node claims (two Nodes naming one instance: one of them lies);
3. the cloud's API, asked read-only with the operator's login, says is a
   member of that group right now:
     AWS    `aws autoscaling describe-auto-scaling-instances --instance-ids ID
            --region R`: AutoScalingInstances[].AutoScalingGroupName and
            .AvailabilityZone (aws-cli awscli/examples/autoscaling/
            describe-auto-scaling-instances.rst; the API ignores an unknown
            ID "with no error", so an instance of another account or region
            comes back as an empty list: AWS API reference,
            DescribeAutoScalingInstances);
     GCP    `gcloud compute instance-groups managed list-instances MIG
            --zone Z --project P --format=json`: each ManagedInstance's
            `instance` is the instance's URL (cloud.google.com/sdk/gcloud/
            reference/compute/instance-groups/managed/list-instances; the
            ManagedInstance resource, compute v1 listManagedInstances);
     Azure  `az vmss show --subscription S --resource-group RG --name VMSS
            --instance-id N`: the scale set's VM, `instanceId` and its
            resource `id` .../virtualMachineScaleSets/VMSS/virtualMachines/N
            (azure-cli vm module help: "--instance-id: VM instance ID. If
            missing, show the VMSS"; ARM VirtualMachineScaleSetVMs_Get).

The command that then takes the instance away is built from the stack's
values (project, subscription, resource group, region, group name), never
from the node's. Anything else is refused with the node, its providerID and
what was expected; the caller holds that node and counts it as failed.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from .kube import HealthError

NODE_GROUPS_OUTPUT = "nodeGroups"

# spec.providerID of the three clouds' machines, as their cloud providers set it
# (cluster-autoscaler matches instances to Nodes by these: docs/REFERENCE facts).
AWS_ID = re.compile(r"\Aaws:///(?P<zone>[a-z0-9-]+)/(?P<instance>i-[0-9a-f]+)\Z")
GCE_ID = re.compile(r"\Agce://(?P<project>[a-z0-9:.-]+)/(?P<zone>[a-z0-9-]+)/(?P<instance>[a-z0-9-]+)\Z")
AZURE_VMSS_ID = re.compile(
    r"\Aazure:///subscriptions/(?P<subscription>[0-9a-fA-F-]+)/resourceGroups/(?P<resource_group>[-\w.()]+)/"
    r"providers/Microsoft\.Compute/virtualMachineScaleSets/(?P<group>[-\w.]+)/virtualMachines/(?P<instance>\d+)\Z",
    re.I)
AZURE_VM_PATH = ("/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Compute/"
                 "virtualMachineScaleSets/{group}/virtualMachines/{instance}")
GCE_INSTANCE_URL_TAIL = "projects/{project}/zones/{zone}/instances/{instance}"


class InstanceRefused(HealthError):
    """corral will not act on this node's instance; the message says why."""


class NodeGroup(BaseModel):
    """One group of a cloud pool, as the stack output `nodeGroups` lists it (the same shape on
    every cloud): an AWS Auto Scaling group, a GCP zonal MIG, an Azure scale set."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    provider: Literal["aws", "gcp", "azure"]
    name: str = Field(min_length=1)
    region: str = Field(min_length=1)
    zones: tuple[str, ...] = Field(min_length=1)
    project: str = ""                                          # GCP
    subscription: str = ""                                     # Azure
    resource_group: str = Field("", alias="resourceGroup")     # Azure

    @model_validator(mode="after")
    def _cloud_ids(self) -> NodeGroup:
        needed = {"gcp": {"project": self.project},
                  "azure": {"subscription": self.subscription, "resourceGroup": self.resource_group}}
        missing = [key for key, value in needed.get(self.provider, {}).items() if not value]
        if missing:
            raise ValueError(f"a {self.provider} group needs {', '.join(missing)}")
        return self

    def describe(self) -> str:
        where = {"aws": f"Auto Scaling group {self.name}", "gcp": f"MIG {self.name}",
                 "azure": f"scale set {self.name}"}[self.provider]
        return f"{where} ({', '.join(self.zones)})"


NodeGroups = dict[str, list[NodeGroup]]
_NODE_GROUPS = TypeAdapter(NodeGroups)


@dataclass(frozen=True)
class Claim:
    """What a providerID says: the instance and where it would be."""

    provider: str
    zone: str               # "" on Azure (the ID carries none)
    instance: str           # AWS instance id, GCE instance name, Azure VMSS instance id
    project: str = ""
    subscription: str = ""
    resource_group: str = ""
    group: str = ""         # Azure: the scale set the ID names


@dataclass(frozen=True)
class Target:
    """A node's instance, matched to a group of its pool by the stack's values."""

    node: str
    pool: str
    provider_id: str
    claim: Claim
    group: NodeGroup


def parse_provider_id(cloud: str, provider_id: str) -> Claim:
    if cloud == "aws" and (m := AWS_ID.match(provider_id)):
        return Claim("aws", m["zone"], m["instance"])
    if cloud == "gcp" and (m := GCE_ID.match(provider_id)):
        return Claim("gcp", m["zone"], m["instance"], project=m["project"])
    if cloud == "azure" and (m := AZURE_VMSS_ID.match(provider_id)):
        return Claim("azure", "", m["instance"], subscription=m["subscription"],
                     resource_group=m["resource_group"], group=m["group"])
    raise InstanceRefused(f"providerID {provider_id or '(none)'!r} is not a {cloud} scale-group instance: "
                          "cannot find the machine to replace")


def _refuse(node: str, provider_id: str, why: str, expected: str) -> InstanceRefused:
    return InstanceRefused(f"refused node {node} (providerID {provider_id}): {why}; expected {expected}")


def _same(a: str, b: str) -> bool:
    # Azure names are case-insensitive; its provider IDs carry the resource group lower-cased.
    return a.lower() == b.lower()


def match(cloud: str, node: str, pool: str, provider_id: str, node_groups: NodeGroups,
          claims: Mapping[str, str] | None = None) -> Target:
    """The group of `pool` the node's providerID places its instance in, by the stack's values
    alone (no cloud call); InstanceRefused names the node, its ID and what was expected."""
    claim = parse_provider_id(cloud, provider_id)
    groups = [g for g in node_groups.get(pool, []) if g.provider == cloud]
    if not groups:
        raise _refuse(node, provider_id, f"the stack output {NODE_GROUPS_OUTPUT} has no {cloud} group of pool "
                      f"{pool}", f"pool {pool} to be one of {', '.join(sorted(node_groups)) or 'none'} "
                      "(run `corral up`, or pass the current outputs)")
    others = sorted(other for other, pid in (claims or {}).items() if pid == provider_id and other != node)
    if others:
        raise _refuse(node, provider_id, f"node(s) {', '.join(others)} claim the same instance",
                      "one Node per instance")
    expected = " or ".join(g.describe() for g in groups)
    first = groups[0]
    if cloud == "aws":
        expected = f"an instance in region {first.region}, {expected} of pool {pool}"
        found = [g for g in groups if claim.zone in g.zones and claim.zone.startswith(g.region)]
        why = f"zone {claim.zone} is in no group of pool {pool}"
    elif cloud == "gcp":
        expected = f"an instance of project {first.project}, region {first.region}, {expected} of pool {pool}"
        if claim.project != first.project:
            raise _refuse(node, provider_id, f"project {claim.project} is not this cluster's", expected)
        found = [g for g in groups if claim.zone in g.zones and claim.instance.startswith(f"{g.name}-")]
        why = f"instance {claim.instance} in {claim.zone} is in no MIG of pool {pool}"
    else:
        expected = (f"an instance of subscription {first.subscription}, resource group {first.resource_group}, "
                    f"{expected} of pool {pool}")
        if not _same(claim.subscription, first.subscription):
            raise _refuse(node, provider_id, f"subscription {claim.subscription} is not this cluster's", expected)
        if not _same(claim.resource_group, first.resource_group):
            raise _refuse(node, provider_id, f"resource group {claim.resource_group} is not this cluster's",
                          expected)
        found = [g for g in groups if _same(claim.group, g.name)]
        why = f"scale set {claim.group} is not one of pool {pool}"
    if len(found) != 1:
        raise _refuse(node, provider_id, why, expected)
    return Target(node, pool, provider_id, claim, found[0])


def membership_command(target: Target) -> list[str]:
    """The read-only call that asks the cloud whether the instance is in the group now."""
    group, claim = target.group, target.claim
    if group.provider == "aws":
        return ["aws", "autoscaling", "describe-auto-scaling-instances", "--instance-ids", claim.instance,
                "--region", group.region, "--output", "json"]
    if group.provider == "gcp":
        return ["gcloud", "compute", "instance-groups", "managed", "list-instances", group.name,
                f"--zone={claim.zone}", f"--project={group.project}", "--format=json"]
    return ["az", "vmss", "show", "--subscription", group.subscription, "--resource-group", group.resource_group,
            "--name", group.name, "--instance-id", claim.instance, "--output", "json"]


def replace_command(target: Target) -> list[str]:
    """The command that takes the instance away so its group replaces it, from the stack's values.

    - AWS: terminate in the Auto Scaling group without lowering its desired
      capacity: the group launches a replacement at once.
    - GCP: `recreate-instances` on the zonal MIG: same name, fresh machine.
    - Azure: delete the scale-set instance; the scale set shrinks by one and
      cluster-autoscaler grows it again for the drained pods still pending
      (a scale set has no replace-in-place that gives new hardware).
    """
    group, claim = target.group, target.claim
    if group.provider == "aws":
        return ["aws", "autoscaling", "terminate-instance-in-auto-scaling-group", "--instance-id", claim.instance,
                "--no-should-decrement-desired-capacity", "--region", group.region]
    if group.provider == "gcp":
        return ["gcloud", "compute", "instance-groups", "managed", "recreate-instances", group.name,
                f"--instances={claim.instance}", f"--zone={claim.zone}", f"--project={group.project}", "--quiet"]
    return ["az", "vmss", "delete-instances", "--subscription", group.subscription, "--resource-group",
            group.resource_group, "--name", group.name, "--instance-ids", claim.instance]


def confirm_membership(target: Target, answer: str) -> None:
    """Refuse unless the cloud's answer to `membership_command` puts the instance in the group."""
    group, claim = target.group, target.claim
    expected = f"{group.describe()} of pool {target.pool}"
    try:
        data = json.loads(answer or "null")
    except json.JSONDecodeError:
        raise _refuse(target.node, target.provider_id, f"{group.provider} CLI did not print JSON", expected) from None
    if group.provider == "aws":
        rows = [r for r in (data or {}).get("AutoScalingInstances") or [] if r.get("InstanceId") == claim.instance]
        if not rows:
            raise _refuse(target.node, target.provider_id, f"AWS knows no Auto Scaling instance {claim.instance} "
                          f"in this account's {group.region}", expected)
        asg, zone = rows[0].get("AutoScalingGroupName"), rows[0].get("AvailabilityZone")
        if asg != group.name or zone != claim.zone:
            raise _refuse(target.node, target.provider_id, f"AWS says it is in Auto Scaling group {asg} ({zone})",
                          expected)
        return
    if group.provider == "gcp":
        tail = GCE_INSTANCE_URL_TAIL.format(project=group.project, zone=claim.zone, instance=claim.instance)
        urls = [str(r.get("instance", "")) for r in data or [] if isinstance(r, dict)]
        if not any(url == tail or url.endswith("/" + tail) for url in urls):
            raise _refuse(target.node, target.provider_id, f"MIG {group.name} in {claim.zone} has no instance "
                          f"{claim.instance} ({len(urls)} member(s))", expected)
        return
    path = AZURE_VM_PATH.format(subscription=group.subscription, resource_group=group.resource_group,
                                group=group.name, instance=claim.instance)
    if not isinstance(data, dict) or str(data.get("instanceId")) != claim.instance \
            or not _same(str(data.get("id", "")), path):
        got = data.get("id") if isinstance(data, dict) else data
        raise _refuse(target.node, target.provider_id, f"Azure answered {got!r}", expected)


def run_cloud_cli(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    except FileNotFoundError:
        raise HealthError(f"{command[0]} is not installed: it looks up and replaces the pool's instances") from None


def verify(cloud: str, node: str, pool: str, provider_id: str, node_groups: NodeGroups,
           claims: Mapping[str, str] | None = None,
           run: Callable[[list[str]], subprocess.CompletedProcess] = run_cloud_cli) -> Target:
    """The node's instance, matched to its pool's group by the stack and confirmed by the cloud."""
    target = match(cloud, node, pool, provider_id, node_groups, claims)
    command = membership_command(target)
    proc = run(command)
    if proc.returncode != 0:
        raise _refuse(node, provider_id, f"{' '.join(command[:3])} ... exit {proc.returncode}: "
                      f"{proc.stderr.strip()[-300:]}", f"{target.group.describe()} of pool {pool}")
    confirm_membership(target, proc.stdout)
    return target


def planned_commands(cloud: str, node: str, pool: str, provider_id: str,
                     node_groups: NodeGroups | HealthError, claims: Mapping[str, str] | None = None) -> tuple[str, str]:
    """`--check`: (the membership query, the replacement) of a node; for a node that would be
    refused, ("(refused: why)", "")."""
    try:
        if isinstance(node_groups, HealthError):
            raise node_groups
        target = match(cloud, node, pool, provider_id, node_groups, claims)
    except HealthError as error:
        return f"(refused: {error})", ""
    return (f"{shlex.join(membership_command(target))}  (must list {target.claim.instance} in "
            f"{target.group.name})", shlex.join(replace_command(target)))


# ------------------------------------------------------------ the stack output

def parse_node_groups(value: object, source: str) -> NodeGroups:
    """`nodeGroups` (pool -> groups), checked; an error names the source and the field."""
    try:
        return _NODE_GROUPS.validate_python(value)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in (NODE_GROUPS_OUTPUT, *first["loc"]))
        raise HealthError(f"{source}: {where}: {first['msg']}") from None


def read_node_groups(cluster: str, outputs_file: Path | None) -> NodeGroups:
    """The stack output `nodeGroups`: from `--outputs FILE` (the stack outputs as JSON, as
    `corral join --outputs` reads them) or `pulumi stack output nodeGroups --json -s CLUSTER`."""
    from corral.nodes.join import JoinError, read_outputs_file, stack_output

    try:
        if outputs_file is None:
            instead = f"pass --outputs FILE (a JSON object with the stack output {NODE_GROUPS_OUTPUT})"
            return parse_node_groups(stack_output(cluster, NODE_GROUPS_OUTPUT, instead=instead), f"stack {cluster}")
        outputs = read_outputs_file(outputs_file)
    except JoinError as error:
        raise HealthError(str(error)) from None
    if not isinstance(outputs, dict) or NODE_GROUPS_OUTPUT not in outputs:
        raise HealthError(f"{outputs_file}: no stack output {NODE_GROUPS_OUTPUT} (a JSON object of stack outputs; "
                          "`pulumi stack output --json` after `corral up` has it)")
    return parse_node_groups(outputs[NODE_GROUPS_OUTPUT], str(outputs_file))
