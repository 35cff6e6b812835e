"""Build Azure components under Pulumi's mocks and record every registration.

A stand-in for the core's plan runner (`corral/infra/plan.py`) while it
does not exist: `record(build)` runs `build()` inside a mocked Pulumi
program, waits for every registration, and returns what `pulumi up` would
send the engine: type, name, parent, protect, retain-on-delete,
ignore-changes and inputs (secrets kept as `Secret` wrappers, so tests can
tell them apart).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from ruamel.yaml import YAML

from corral.infra.platform import ClusterContext
from corral.model import Cluster
from corral.model.rules import check_cluster

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Secret:
    """A secret input value, as the engine receives it."""

    value: Any


@dataclass
class Registration:
    type: str
    name: str
    urn: str
    parent: str
    protect: bool
    retain_on_delete: bool
    ignore_changes: list[str]
    inputs: dict[str, Any]
    depends_on: list[str] = field(default_factory=list)


def _unwrap(value: Any) -> Any:
    """Replace the engine's secret envelopes by `Secret`, recursively."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return Secret(_unwrap(value.get("value")))
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


class _Mocks(pulumi.runtime.Mocks):
    """Echo inputs as outputs; ids and a few computed outputs made up."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        state = dict(args.inputs)
        rid = f"/mock/{args.typ}/{args.name}"
        if args.typ == "azure-native:resources:ResourceGroup":
            rid = f"/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/{args.name}"
            state.setdefault("name", args.inputs.get("resourceGroupName", args.name))
        elif args.typ == "azure-native:network:PublicIPAddress":
            state["ipAddress"] = "198.51.100.7"
        elif args.typ == "tls:index/privateKey:PrivateKey":
            state["publicKeyOpenssh"] = "ssh-rsa AAAAmock corral"
            state["privateKeyOpenssh"] = "-----BEGIN OPENSSH PRIVATE KEY-----mock"
        elif args.typ == "azure-native:compute:VirtualMachine" and "identity" in args.inputs:
            state["identity"] = {**args.inputs["identity"], "principalId": f"principal-{args.name}"}
        elif args.typ == "azure-native:managedidentity:UserAssignedIdentity":
            state["principalId"] = f"principal-{args.name}"
        identity = state.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # ARM takes user-assigned identities as a list of ids and reports a map.
            state["identity"] = {**identity, "userAssignedIdentities": {i: {} for i in identity["userAssignedIdentities"]}}
        for key in ("vmName", "virtualNetworkName", "subnetName", "loadBalancerName",
                    "vmScaleSetName", "diskName", "networkInterfaceName"):
            if key in args.inputs:
                state.setdefault("name", args.inputs[key])
        return rid, state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks):
        super().__init__(mocks)
        self.records: list[Registration] = []

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            inputs = rpc.deserialize_properties(request.object, keep_unknowns=True, keep_internal=True)
            self.records.append(Registration(
                type=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent,
                protect=bool(request.protect),
                retain_on_delete=bool(request.retainOnDelete),
                ignore_changes=list(request.ignoreChanges),
                inputs=_unwrap(inputs),
                depends_on=list(request.dependencies),
            ))
        return response


def record(build: Callable[[], Any]) -> tuple[list[Registration], Any]:
    """Run `build()` under mocks; return the registrations and what `build`
    returned, with every Output in it resolved (dicts and lists walked)."""
    monitor = _RecordingMonitor(_Mocks())
    pulumi.runtime.set_mocks(_Mocks(), project="corral", stack="test", preview=False, monitor=monitor)
    result: dict[str, Any] = {}

    @pulumi.runtime.test
    def program():
        built = build()
        return pulumi.Output.from_input(built).apply(lambda resolved: result.setdefault("value", resolved))

    program()
    return monitor.records, result.get("value")


def load(name: str, **edits: Callable[[dict], None]) -> Cluster:
    """An example cluster, optionally edited as YAML data first; validated."""
    data = YAML(typ="safe").load((ROOT / "clusters" / f"{name}.yaml").read_text())
    for edit in edits.values():
        edit(data)
    cluster = Cluster.model_validate(data)
    problems = check_cluster(cluster)
    assert not problems, problems
    return cluster


def context(cluster: Cluster) -> ClusterContext:
    return ClusterContext.of(cluster)
