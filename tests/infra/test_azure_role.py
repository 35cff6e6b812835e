"""The API servers' identity on Azure drives the pools' scale sets through a custom role with
only the operations its users call (cluster-autoscaler, the node approver, the repair
controller), assigned on each scale set: not the built-in Virtual Machine Contributor, whose
`virtualMachineScaleSets/*` also runs commands on the nodes, installs extensions, reimages
them and deletes whole sets. Read from the mocked plan of the jaguar example.
"""

from __future__ import annotations

import fnmatch

from corral.health import cloud_api

from .test_azure import jaguar  # noqa: F401  (the module-scoped plan fixture)

ROLE = "jaguar-scale-set-operator"
ROLE_ID = f"/mock/azure-native:authorization:RoleDefinition/{ROLE}"
RESOURCE_GROUP = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/jaguar-rg"
# What the role must never allow on a node pool's scale set (the same "Azure permissions for
# Compute" names): code on the nodes, the set's removal, the nodes' disks and power.
FORBIDDEN = (
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/runCommand/action",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/runCommands/write",
    "Microsoft.Compute/virtualMachineScaleSets/extensions/write",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/extensions/write",
    "Microsoft.Compute/virtualMachineScaleSets/delete",
    "Microsoft.Compute/virtualMachineScaleSets/reimage/action",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/reimage/action",
    "Microsoft.Compute/virtualMachineScaleSets/redeploy/action",
    "Microsoft.Compute/virtualMachineScaleSets/powerOff/action",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write",
)


def _allows(actions: list[str], operation: str) -> bool:
    """Azure matches a role's actions case-insensitively, `*` as a wildcard."""
    return any(fnmatch.fnmatchcase(operation.lower(), action.lower()) for action in actions)


def test_the_scale_set_role_holds_exactly_what_its_users_call(jaguar):  # noqa: F811
    role = jaguar.one("authorization:RoleDefinition", ROLE)
    (permission,) = role.inputs["permissions"]
    actions = permission["actions"]
    assert sorted(actions) == sorted({
        "Microsoft.Compute/virtualMachineScaleSets/read",
        "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
        "Microsoft.Compute/virtualMachineScaleSets/write",
        "Microsoft.Compute/virtualMachineScaleSets/delete/action",
    })
    assert not [a for a in actions if "*" in a]
    assert not permission.get("dataActions")
    # The in-cluster cloud client's calls are covered: the approver's lookup, the repair's replace.
    for operation in (*cloud_api.READ_PERMISSIONS["azure"], *cloud_api.REPLACE_PERMISSIONS["azure"]):
        assert _allows(actions, operation), operation
    for operation in FORBIDDEN:
        assert not _allows(actions, operation), operation
    # Defined in, and assignable only inside, the cluster's resource group.
    assert role.inputs["scope"] == RESOURCE_GROUP
    assert role.inputs["assignableScopes"] == [role.inputs["scope"]]


def test_each_api_server_gets_the_role_on_each_scale_set_and_nowhere_else(jaguar):  # noqa: F811
    scale_sets = {f"/mock/azure-native:compute:VirtualMachineScaleSet/{s.name}"
                  for s in jaguar.of("compute:VirtualMachineScaleSet")}
    api = {f"principal-{m.name}" for m in jaguar.ctx.layout.api_servers}
    grants = [r for r in jaguar.of("authorization:RoleAssignment") if r.inputs["roleDefinitionId"] == ROLE_ID]
    assert scale_sets and {(r.inputs["scope"], r.inputs["principalId"]) for r in grants} == {
        (scope, principal) for scope in scale_sets for principal in api}
    assert len(grants) == len(scale_sets) * len(api)


def test_no_one_holds_virtual_machine_contributor_any_more(jaguar):  # noqa: F811
    built_in = "/providers/Microsoft.Authorization/roleDefinitions/9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
    assert not [r.name for r in jaguar.of("authorization:RoleAssignment") if r.inputs["roleDefinitionId"].endswith(built_in)]
