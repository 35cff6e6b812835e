"""Cloud node pools: one VM scale set per pool and zone, sized by the cluster autoscaler."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import pulumi
import pulumi_azure_native as azure

from corral.health import cloud_api
from corral.infra.platform import ClusterContext
from corral.manifests.policy import autoscaler_node_groups
from corral.model.schema import CloudPool
from corral.machine.rollout import KUBELET_HEALTHZ_PORT, SURGE_PERCENT, WARMUP_SECONDS, rolls_on_deploy

from .common import (
    ADMIN_USERNAME,
    accelerated_networking,
    boot_diagnostics,
    custom_data,
    linux_configuration,
    location,
    node_image,
    pick,
    tags,
)
from .secrets import custom_role

# What the API servers' identity may do to a pool's scale set: a custom role holding only the
# operations its users call, assigned on each scale set (never on the resource group, which
# holds etcd's VMs and disks). The built-in Virtual Machine Contributor it replaces also
# allowed, on the set, run commands and extensions on its VMs (root on every node), reimage,
# redeploy, power actions and deleting the whole set. Action names from "Azure permissions for
# Compute" (learn.microsoft.com/azure/role-based-access-control/permissions/compute;
# MicrosoftDocs/azure-docs, role-based-access-control resource provider operations).
#
# cluster-autoscaler's Azure provider (kubernetes/autoscaler cluster-autoscaler-1.31,
# cloudprovider/azure; its README asks for Contributor and lists no narrower set, so these
# are the calls the code makes for `vmType: vmss`):
AUTOSCALER_ACTIONS = (
    # VirtualMachineScaleSets Get and List (azure_scale_set.go getVMSSFromCache, azure_cache.go
    # fetchScaleSets): "Get the properties of a Virtual Machine Scale Set".
    "Microsoft.Compute/virtualMachineScaleSets/read",
    # VirtualMachineScaleSetVMs List (azure_scale_set.go GetScaleSetVms): "Retrieves the
    # properties of a Virtual Machine in a VM Scale Set".
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    # VirtualMachineScaleSets CreateOrUpdate with only name, sku and location, the new capacity
    # (azure_scale_set.go createOrUpdateInstances): "Creates a new Virtual Machine Scale Set or
    # updates an existing one". Azure has no narrower action for the capacity alone (scale/action
    # only "verif[ies] if [it] can Scale In/Scale Out"), so this one still lets the identity
    # change the set's model: see docs/security.md.
    "Microsoft.Compute/virtualMachineScaleSets/write",
    # VirtualMachineScaleSets DeleteInstances (azure_force_delete_scale_set.go, scale down):
    # "Deletes the instances of the Virtual Machine Scale Set".
    "Microsoft.Compute/virtualMachineScaleSets/delete/action",
)
# The node approver's instance check and the repair controller's replace
# (corral/health/cloud_api.py READ_PERMISSIONS, REPLACE_PERMISSIONS): both already among the
# autoscaler's (tests/infra/test_azure_role.py checks it).
SCALE_SET_ACTIONS = tuple(sorted({*AUTOSCALER_ACTIONS, *cloud_api.READ_PERMISSIONS["azure"],
                                  *cloud_api.REPLACE_PERMISSIONS["azure"]}))
# A Uniform scale set outside a single placement group holds at most 1,000 VMs.
VMSS_MAX_INSTANCES = 1_000
# Linux scale sets: `computerNamePrefix` is at most 58 characters.
MAX_COMPUTER_NAME_PREFIX = 58
# cluster-autoscaler's Azure provider (cloudprovider/azure/README.md):
# `--node-group-auto-discovery=label:cluster-autoscaler-enabled=true,cluster-autoscaler-name=<cluster>`
# finds scale sets by these tags and reads their bounds from `min` / `max`.
CA_ENABLED_TAG = "cluster-autoscaler-enabled"
CA_NAME_TAG = "cluster-autoscaler-name"
# Node templates for scaling from zero: the labels and taints a new node
# will register with. Azure tag names cannot hold "/", so it becomes "_".
CA_LABEL_TAG = "k8s.io_cluster-autoscaler_node-template_label_"
CA_TAINT_TAG = "k8s.io_cluster-autoscaler_node-template_taint_"


def autoscaler_discovery(cluster_name: str) -> str:
    """The cluster-autoscaler flag value that finds this cluster's scale sets."""
    return f"label:{CA_ENABLED_TAG}=true,{CA_NAME_TAG}={cluster_name}"


def autoscaler_tags(ctx: ClusterContext, pool: CloudPool, min_size: int, max_size: int) -> dict[str, str]:
    """Discovery, bounds (this scale set's share of the pool's) and node-template tags of a pool's scale set."""
    cluster = ctx.cluster
    result = {
        CA_ENABLED_TAG: "true",
        CA_NAME_TAG: cluster.name,
        # The same marks AWS ASGs carry (k8s.io/cluster-autoscaler/...), with
        # "/" spelled "_" as Azure tag names require: one vocabulary for
        # inventory scripts across clouds.
        "k8s.io_cluster-autoscaler_enabled": "true",
        f"k8s.io_cluster-autoscaler_{cluster.name}": "owned",
        "min": str(min_size),
        "max": str(min(max_size, VMSS_MAX_INSTANCES)),
    }
    for key, value in cluster.node_labels(pool).items():
        result[CA_LABEL_TAG + key.replace("/", "_")] = value
    for taint in cluster.node_taints(pool):
        result[CA_TAINT_TAG + taint.key.replace("/", "_")] = f"{taint.value}:{taint.effect}"
    return result



def upgrade_policy(pool: CloudPool) -> azure.compute.UpgradePolicyArgs:
    """Rolling, surge-first, for CPU pools; Manual for GPU pools (corral/machine/rollout.py)."""
    if not rolls_on_deploy(pool):
        return azure.compute.UpgradePolicyArgs(mode="Manual")
    return azure.compute.UpgradePolicyArgs(
        mode="Rolling",
        rolling_upgrade_policy=azure.compute.RollingUpgradePolicyArgs(
            max_batch_instance_percent=SURGE_PERCENT,
            # New VMs first; the old ones of a batch go once the new are healthy.
            max_surge=True,
            max_unhealthy_instance_percent=20,
            max_unhealthy_upgraded_instance_percent=SURGE_PERCENT,
            pause_time_between_batches=f"PT{WARMUP_SECONDS}S",
            prioritize_unhealthy_instances=True,
        ),
    )


def health_extension(pool: CloudPool) -> azure.compute.VirtualMachineScaleSetExtensionProfileArgs | None:
    """A Rolling scale set needs a health signal: the kubelet's /healthz, probed on the VM itself."""
    if not rolls_on_deploy(pool):
        return None
    return azure.compute.VirtualMachineScaleSetExtensionProfileArgs(extensions=[
        azure.compute.VirtualMachineScaleSetExtensionArgs(
            name="kubelet-health",
            publisher="Microsoft.ManagedServices",
            type="ApplicationHealthLinux",
            type_handler_version="2.0",
            auto_upgrade_minor_version=True,
            settings={"protocol": "http", "port": KUBELET_HEALTHZ_PORT, "requestPath": "/healthz"},
        ),
    ])

class NodePools(pulumi.ComponentResource):
    """Per cloud pool and pool zone a Uniform VM scale set, named
    `azure_zonal_group_name(cluster, pool, zone)` (`jaguar-cpu-d64-2`).

    Uniform, not Flexible: cluster-autoscaler's Azure provider (vmType
    `vmss`) drives Uniform scale sets, including scale from zero; Flexible
    ones go through its separate, younger VMSS-Flex path.

    One scale set per zone, not one spanning the zones: a scale set's network
    profile names one subnet for every instance, whatever its zone, and each
    zone's node subnet carries that zone's NAT gateway. A zone-spanning set
    would put every node on one zone's subnet and egress (that zone's loss
    cuts the whole pool off), and Azure has no per-zone subnet in a scale
    set. Zonal sets also let the autoscaler grow the zone a pending pod
    needs. The pool's min/max are split across its zones (the manifests'
    `autoscaler_node_groups` is the one split; the autoscaler runs with
    `--balance-similar-node-groups`, so the zones grow evenly).

    Each set starts at its share of minSize (`sku.capacity`, ignored
    afterwards so a plan never fights the autoscaler). Spot pools use
    `priority: Spot`, eviction Delete, paying at most the on-demand price.

    cluster-autoscaler sizes each scale set. It finds it by name
    (`--nodes=min:max:<name>`, what corral.manifests configures) or by the
    discovery tags (`autoscaler_discovery(cluster)` is that flag, bounds
    from the `min`/`max` tags); node-template label/taint tags describe a
    new node when the set is at zero.

    Each scale set also gets an Azure autoscale setting with one profile,
    minimum/maximum/default = minSize/maxSize/minSize and NO rules: Azure
    then only holds the count inside the pool's bounds (as AWS does with an
    ASG's min/max) and never scales on metrics itself, so the cluster
    autoscaler alone decides. Rules here would fight it.

    Each pool has one user-assigned identity, which all its zonal scale sets
    carry (`identities`: pool name -> principal id, as on the other clouds);
    it may read only the pool's secret.
    `allow_resize(identities)` gives the API servers' identities (the
    autoscaler, the node approver, the repair controller) the custom role
    `scale_set_role` (SCALE_SET_ACTIONS) on each scale set and nowhere else.

    Attributes: scale_sets / autoscale_settings: scale set name -> resource,
    pool_scale_sets: pool name -> {zone: scale set},
    node_groups: pool name -> [{provider, name, region, zones ([its zone]),
    subscription, resourceGroup}] per scale set (the stack output nodeGroups),
    autoscaler_discovery (the `--node-group-auto-discovery` value),
    identities, resize_grants, scale_set_role (None until allow_resize).
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network,
        user_data: Mapping[str, pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:azure:NodePools", name, None, opts)
        cluster = ctx.cluster
        self.scale_sets: dict[str, azure.compute.VirtualMachineScaleSet] = {}
        self.autoscale_settings: dict[str, azure.monitor.AutoscaleSetting] = {}
        self.autoscaler_discovery = autoscaler_discovery(cluster.name)
        self.identities: dict[str, pulumi.Output[str]] = {}
        self.resize_grants: list[azure.authorization.RoleAssignment] = []
        self.scale_set_role: azure.authorization.RoleDefinition | None = None
        self._ctx, self._network = ctx, network

        self.pool_scale_sets: dict[str, dict[str, azure.compute.VirtualMachineScaleSet]] = {}
        self.node_groups: dict[str, list[dict]] = {}
        pool_identities: dict[str, azure.managedidentity.UserAssignedIdentity] = {}
        for group in autoscaler_node_groups(cluster):
            pool = cluster.pool(group.pool)
            if pool.provider != "azure":
                continue
            if pool.name not in pool_identities:
                # One identity per pool, whatever its zones (see `identities`).
                identity_name = ctx.resource_name(pool.name, "identity")
                pool_identities[pool.name] = azure.managedidentity.UserAssignedIdentity(
                    identity_name,
                    resource_name_=identity_name,
                    resource_group_name=network.resource_group_name,
                    location=location(ctx),
                    tags=tags(ctx, **{"corral-pool": pool.name}),
                    opts=pulumi.ResourceOptions(parent=self),
                )
                self.identities[pool.name] = pool_identities[pool.name].principal_id
            pool_identity = pool_identities[pool.name]
            zone, set_name = group.zone, group.name
            if len(set_name) + 1 > MAX_COMPUTER_NAME_PREFIX:
                raise ValueError(
                    f"pool {pool.name}: scale set {set_name!r} is too long for Azure "
                    f"(the node name prefix takes at most {MAX_COMPUTER_NAME_PREFIX} characters); "
                    "shorten the cluster or pool name"
                )
            # The zone's node subnet: its NAT gateway is the zone's egress.
            subnet_id = pick(network.node_subnet_ids, zone, "node subnet")
            max_size = min(group.max_size, VMSS_MAX_INSTANCES)
            if group.max_size > VMSS_MAX_INSTANCES:
                pulumi.log.warn(
                    f"pool {pool.name}: zone {zone}'s share of maxSize, {group.max_size:,}, is above an Azure "
                    f"scale set's {VMSS_MAX_INSTANCES:,} VMs; the scale set is capped at {VMSS_MAX_INSTANCES:,} "
                    "(split the pool to go further)"
                )
            spot = pool.spot
            vmss = azure.compute.VirtualMachineScaleSet(
                set_name,
                vm_scale_set_name=set_name,
                resource_group_name=network.resource_group_name,
                location=location(ctx),
                zones=[zone],
                orchestration_mode="Uniform",
                sku=azure.compute.SkuArgs(name=pool.machine_type, tier="Standard", capacity=group.min_size),
                # The autoscaler adds exactly the VMs it asks for; no extra
                # VMs that boot, join and vanish.
                overprovision=False,
                # Above 100 VMs a scale set must span placement groups.
                single_placement_group=False,
                platform_fault_domain_count=1,
                upgrade_policy=upgrade_policy(pool),
                virtual_machine_profile=azure.compute.VirtualMachineScaleSetVMProfileArgs(
                    os_profile=azure.compute.VirtualMachineScaleSetOSProfileArgs(
                        computer_name_prefix=f"{set_name}-",
                        admin_username=ADMIN_USERNAME,
                        custom_data=custom_data(pick(user_data, pool.name, "user data")),
                        linux_configuration=linux_configuration(network.admin_ssh_public_key),
                    ),
                    storage_profile=azure.compute.VirtualMachineScaleSetStorageProfileArgs(
                        # GPU pools boot corral:gpuNodeImage (NVIDIA driver baked in), else nodeImage.
                        image_reference=node_image(ctx, gpu_pool=pool.name if pool.gpu else None),
                        os_disk=azure.compute.VirtualMachineScaleSetOSDiskArgs(
                            create_option="FromImage",
                            caching="ReadWrite",
                            disk_size_gb=pool.disk_size_gib,
                            delete_option="Delete",
                            managed_disk=azure.compute.VirtualMachineScaleSetManagedDiskParametersArgs(
                                storage_account_type="Premium_LRS",
                            ),
                        ),
                    ),
                    network_profile=azure.compute.VirtualMachineScaleSetNetworkProfileArgs(
                        network_interface_configurations=[
                            azure.compute.VirtualMachineScaleSetNetworkConfigurationArgs(
                                name="nic",
                                primary=True,
                                # Nodes route pod traffic (flannel).
                                enable_ip_forwarding=True,
                                enable_accelerated_networking=accelerated_networking(pool.machine_type),
                                ip_configurations=[
                                    azure.compute.VirtualMachineScaleSetIPConfigurationArgs(
                                        name="ipconfig",
                                        primary=True,
                                        private_ip_address_version="IPv4",
                                        subnet=azure.compute.ApiEntityReferenceArgs(id=subnet_id),
                                    )
                                ],
                            )
                        ],
                    ),
                    diagnostics_profile=boot_diagnostics(),
                    extension_profile=health_extension(pool),
                    priority="Spot" if spot else "Regular",
                    eviction_policy="Delete" if spot else None,
                    # -1: pay up to the on-demand price; evicted only for capacity.
                    billing_profile=azure.compute.BillingProfileArgs(max_price=-1) if spot else None,
                ),
                # The pool's identity, shared by its zonal scale sets: it
                # reads the pool's bootstrap token and nothing else.
                identity=azure.compute.VirtualMachineScaleSetIdentityArgs(
                    type="UserAssigned", user_assigned_identities=[pool_identity.id],
                ),
                tags=tags(ctx, **{"corral-role": "node", "corral-pool": pool.name, "corral-zone": zone},
                          **autoscaler_tags(ctx, pool, group.min_size, group.max_size)),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    ignore_changes=["sku.capacity"],
                    depends_on=network.egress,
                ),
            )
            bounds = ctx.resource_name(pool.name, zone, "bounds")
            setting = azure.monitor.AutoscaleSetting(
                bounds,
                autoscale_setting_name=bounds,
                name=bounds,
                target_resource_location=location(ctx),
                resource_group_name=network.resource_group_name,
                location=location(ctx),
                target_resource_uri=vmss.id,
                enabled=True,
                profiles=[
                    azure.monitor.AutoscaleProfileArgs(
                        name="pool-bounds",
                        capacity=azure.monitor.ScaleCapacityArgs(
                            minimum=str(group.min_size),
                            maximum=str(max_size),
                            default=str(group.min_size),
                        ),
                        # No rules: bounds only; cluster-autoscaler decides.
                        rules=[],
                    )
                ],
                tags=tags(ctx),
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.scale_sets[set_name] = vmss
            self.pool_scale_sets.setdefault(pool.name, {})[zone] = vmss
            self.node_groups.setdefault(pool.name, []).append({
                "provider": "azure", "name": set_name, "region": location(ctx), "zones": [zone],
                "subscription": network.subscription_id, "resourceGroup": network.resource_group_name})
            self.autoscale_settings[set_name] = setting

        # What the cluster-autoscaler needs to find the scale sets.
        self.cloud_settings = {
            "ARM_SUBSCRIPTION_ID": network.subscription_id,
            "ARM_RESOURCE_GROUP": network.resource_group_name,
        }
        self.register_outputs({
            "scale_set_names": list(self.scale_sets),
            "autoscaler_discovery": self.autoscaler_discovery,
        })

    def allow_resize(self, identities: Mapping[str, pulumi.Input[str]]) -> None:
        """Let `identities` (the API servers': cluster-autoscaler, the node approver and the
        repair controller run there) drive the scale sets: the custom role holding
        SCALE_SET_ACTIONS, assigned on each scale set, nothing wider."""
        if not self.scale_sets:
            return
        rn = self._ctx.resource_name
        role_name = rn("scale-set-operator")
        # Defined in the cluster's resource group and assignable only there (AssignableScopes:
        # "Understand role definitions"); assigned below on each scale set, a scope inside it.
        self.scale_set_role = custom_role(
            role_name, f"Size {self._ctx.cluster.name}'s node pool scale sets, list their VMs and delete chosen ones",
            self._network.resource_group_id, actions=SCALE_SET_ACTIONS, opts=pulumi.ResourceOptions(parent=self),
        )
        for set_name, vmss in self.scale_sets.items():
            for reader, principal in identities.items():
                prefix = self._ctx.cluster.name + "-"
                name = rn("resize", set_name.removeprefix(prefix), "by", reader.removeprefix(prefix))
                self.resize_grants.append(azure.authorization.RoleAssignment(
                    name,
                    # A new name for the new role: an assignment's role cannot change in place.
                    role_assignment_name=str(uuid.uuid5(uuid.NAMESPACE_URL, f"corral/{name}/{role_name}")),
                    principal_id=principal,
                    principal_type="ServicePrincipal",
                    role_definition_id=self.scale_set_role.id,
                    scope=vmss.id,
                    description=f"cluster-autoscaler, node approver and repair on {reader} drive scale set {set_name}",
                    opts=pulumi.ResourceOptions(parent=self),
                ))
