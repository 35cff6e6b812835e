"""What the Azure components share: image, admin user, names, ids, user data.

Stack settings: `corral:keyVaultName` (secrets.py), the bootstrap token
settings every cloud reads (stacks/README.md), and the boot images, the same
two keys as on AWS and GCP:

    corral:nodeImage       image of every machine (etcd, API servers, nodes)
                           as an ARM id: a managed image (what Packer's
                           `azure-arm` build in node-images/ makes:
                           `/subscriptions/S/resourceGroups/RG/providers/
                           Microsoft.Compute/images/NAME`) or an Azure Compute
                           Gallery image (`.../galleries/G/images/D`, latest
                           version) or image version (`.../versions/1.2.3`).
                           Default: the Debian 12 Marketplace image
                           (`MARKETPLACE_IMAGE`), with a warning at preview.
    corral:gpuNodeImage    image of GPU pools (NVIDIA driver baked in);
                           default: `corral:nodeImage`. A GPU pool with
                           neither set is refused: the Marketplace image has no
                           NVIDIA driver, so its nodes would keep the
                           preflight taint forever.

Everything here is plain Python over `ClusterContext`: no resource is
created, so each component module reads top to bottom as the resources it
registers.
"""

from __future__ import annotations

import base64
import gzip
import re
from collections.abc import Sequence

import pulumi
import pulumi_azure_native as azure

from corral.infra import platform
from corral.infra.platform import pick  # noqa: F401 (used by the components)
from corral.infra.platform import ClusterContext, warn_once

# Debian 12 "bookworm", generation-2 (UEFI) image from the Azure Marketplace,
# the same distribution the on-prem roles target (ansible/roles/*/meta), with
# cloud-init reading `customData` and the Azure udev rules that create
# /dev/disk/azure/scsi1/lun<N>. `latest` follows Debian's point releases;
# pin a version ("0.20240211.1654" style) to freeze a cluster's image.
# Booted only when the stack sets no `corral:nodeImage` (see `node_image`);
# it is also the base node-images/gpu-node.pkr.hcl's azure-arm source builds on.
MARKETPLACE_IMAGE = azure.compute.ImageReferenceArgs(
    publisher="Debian",
    offer="debian-12",
    sku="12-gen2",
    version="latest",
)

# The ARM ids `corral:nodeImage` / `corral:gpuNodeImage` take. ImageReference's
# `id` names a managed image or a gallery image, with or without a version
# (without: the gallery's latest); publisher/offer/sku/version are for
# Marketplace images only, and a gallery image "should always use 'id'"
# (ImageReference, learn.microsoft.com/javascript/api/@azure/arm-compute/
# imagereference; azure-native's ImageReferenceArgs has the same `id` field).
IMAGE_ID = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
    r"(images/[^/]+|galleries/[^/]+/images/[^/]+(/versions/[^/]+)?)$",
    re.IGNORECASE,
)

# The login cloud-init creates. Password login is off; the key is generated
# per cluster by Network (see `Network.admin_ssh_private_key`).
ADMIN_USERNAME = "corral"

# etcd's data disk is attached at this LUN. On Azure the udev rules shipped
# with the Linux agent name it `/dev/disk/azure/scsi1/lun<LUN>`, which the
# bootstrap (etcd cloud-init) formats and mounts at /var/lib/etcd.
ETCD_DISK_LUN = 0
ETCD_DISK_DEVICE = f"/dev/disk/azure/scsi1/lun{ETCD_DISK_LUN}"

# OS disks of control-plane machines (etcd data lives on its own disk).
CONTROL_OS_DISK_GIB = 64
# Azure takes at most 64 KiB of customData (base64-encoded).
CUSTOM_DATA_LIMIT = 64 * 1024
# Azure's limit of tags on one resource.
MAX_TAGS = 50


def config() -> pulumi.Config:
    return pulumi.Config("corral")


def node_image(ctx: ClusterContext, gpu_pool: str | None = None) -> azure.compute.ImageReferenceArgs:
    """The image a machine boots: `gpu_pool` names the GPU pool asking, if one is.

    See the module docstring for the settings; as on AWS and GCP, an unset
    `corral:nodeImage` is a warning (here the Marketplace image still boots),
    but a GPU pool never boots an image without the NVIDIA driver.
    """
    cfg = config()
    key = "gpuNodeImage" if gpu_pool is not None and cfg.get("gpuNodeImage") else "nodeImage"
    image = cfg.get(key)
    stack_file = f"stacks/Pulumi.{ctx.cluster.name}.yaml"
    if image:
        if not IMAGE_ID.match(image.strip()):
            raise ValueError(
                f"{stack_file}: corral:{key} is {image!r}, not an image's ARM id: expected "
                "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/images/NAME (Packer's "
                "azure-arm build) or .../galleries/G/images/D[/versions/V] (an Azure Compute Gallery image)"
            )
        return azure.compute.ImageReferenceArgs(id=image.strip())
    if gpu_pool is not None:
        raise ValueError(
            f"{stack_file}: GPU pool {gpu_pool} needs corral:gpuNodeImage or corral:nodeImage: without "
            "either it would boot the Debian Marketplace image, which has no NVIDIA driver, and its nodes "
            f"would never pass the GPU preflight. Build one (node-images/README.md, -only=azure-arm.gpu-node), "
            f"then `pulumi config set -s {ctx.cluster.name} corral:gpuNodeImage /subscriptions/.../images/NAME`"
        )
    warn_once(
        "corral:nodeImage is not set: machines boot the Debian 12 Marketplace image "
        f"({MARKETPLACE_IMAGE.publisher}:{MARKETPLACE_IMAGE.offer}:{MARKETPLACE_IMAGE.sku}:"
        f"{MARKETPLACE_IMAGE.version}), not an image from node-images/. Set it with "
        "`pulumi config set corral:nodeImage /subscriptions/.../providers/Microsoft.Compute/images/NAME`."
    )
    return MARKETPLACE_IMAGE


def location(ctx: ClusterContext) -> str:
    return ctx.cluster.control_plane.region


def check_location(ctx: ClusterContext) -> None:
    """The stack's provider location, when set, must be the cluster's region.

    Every resource names its location explicitly (the cluster file is the
    only place it is written); a stack setting that disagrees is a mistake
    worth stopping for, not a silent override.
    """
    platform.check_region(ctx, "azure-native", "location")


def tags(ctx: ClusterContext, **extra: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    """The cluster's common tags plus any extra ones (Azure: at most 50)."""
    merged = {**ctx.tags, **extra}
    if len(merged) > MAX_TAGS:
        raise ValueError(
            f"{len(merged)} tags, but an Azure resource takes at most {MAX_TAGS} "
            f"(cluster {ctx.cluster.name}: too many pool labels and taints?)"
        )
    return merged


def child_id(parent_id: pulumi.Input[str], *segments: str) -> pulumi.Output[str]:
    """An ARM id below another: `child_id(rg.id, "providers/Microsoft.Network/loadBalancers", "x")`.

    Sub-resources (a load balancer's frontend, a gateway's IP configuration)
    are referenced by ids their parent only gets once created; ARM ids are
    deterministic, so they are built from the resource group's id instead of
    an extra `getClientConfig` call.
    """
    return pulumi.Output.concat(parent_id, *("/" + s for s in segments))


def encode_custom_data(text: str) -> str:
    """Base64 cloud-init, gzipped (cloud-init reads both) when it would not fit."""
    raw = text.encode()
    encoded = base64.b64encode(raw).decode()
    if len(encoded) > CUSTOM_DATA_LIMIT:
        encoded = base64.b64encode(gzip.compress(raw, mtime=0)).decode()
        if len(encoded) > CUSTOM_DATA_LIMIT:
            raise ValueError(
                f"custom data is {len(encoded):,} bytes base64 even gzipped; "
                f"Azure takes at most {CUSTOM_DATA_LIMIT:,}"
            )
    return encoded


def custom_data(user_data: pulumi.Input[str]) -> pulumi.Output[str]:
    """`user_data` (cloud-init holding references to secrets, never secrets) as Azure wants it."""
    return pulumi.Output.from_input(user_data).apply(encode_custom_data)


_SIZE = re.compile(r"^Standard_([A-Z]+)(\d+)")


def accelerated_networking(vm_size: str) -> bool:
    """Whether to ask for Accelerated Networking on a VM size.

    Azure rejects it on sizes without support: the A and B families and
    single-vCPU sizes. Every other current family (D, E, F, L, M, N*, H*)
    with two vCPUs or more supports it.
    """
    match = _SIZE.match(vm_size)
    if not match:
        return False
    family, vcpus = match.group(1), int(match.group(2))
    return vcpus >= 2 and family[0] not in ("A", "B")


def linux_configuration(ssh_public_key: pulumi.Input[str]) -> azure.compute.LinuxConfigurationArgs:
    return azure.compute.LinuxConfigurationArgs(
        disable_password_authentication=True,
        provision_vm_agent=True,
        ssh=azure.compute.SshConfigurationArgs(
            public_keys=[
                azure.compute.SshPublicKeyArgs(
                    path=f"/home/{ADMIN_USERNAME}/.ssh/authorized_keys",
                    key_data=ssh_public_key,
                )
            ]
        ),
    )


def boot_diagnostics() -> azure.compute.DiagnosticsProfileArgs:
    """Serial console and boot screenshots, in Azure-managed storage."""
    return azure.compute.DiagnosticsProfileArgs(
        boot_diagnostics=azure.compute.BootDiagnosticsArgs(enabled=True)
    )


def control_plane_vm(
    ctx: ClusterContext,
    network,
    name: str,
    zone: str,
    vm_size: str,
    nic: azure.network.NetworkInterface,
    user_data: pulumi.Input[str],
    role: str,
    opts: pulumi.ResourceOptions,
    data_disks: Sequence[azure.compute.DataDiskArgs] = (),
    ultra_ssd: bool = False,
    identity: azure.compute.VirtualMachineIdentityArgs | None = None,
) -> azure.compute.VirtualMachine:
    """A zonal control-plane VM (etcd member or API server) on its own NIC."""
    return azure.compute.VirtualMachine(
        name,
        vm_name=name,
        resource_group_name=network.resource_group_name,
        location=location(ctx),
        zones=[zone],
        hardware_profile=azure.compute.HardwareProfileArgs(vm_size=vm_size),
        # Ultra Disks attach only to VMs created with this capability;
        # Premium SSD v2 needs none (only a zonal VM).
        additional_capabilities=(
            azure.compute.AdditionalCapabilitiesArgs(ultra_ssd_enabled=True) if ultra_ssd else None
        ),
        storage_profile=azure.compute.StorageProfileArgs(
            image_reference=node_image(ctx),
            os_disk=azure.compute.OSDiskArgs(
                name=f"{name}-os",
                create_option="FromImage",
                caching="ReadWrite",
                disk_size_gb=CONTROL_OS_DISK_GIB,
                delete_option="Delete",
                managed_disk=azure.compute.ManagedDiskParametersArgs(
                    storage_account_type="Premium_LRS",
                ),
            ),
            data_disks=list(data_disks) or None,
        ),
        os_profile=azure.compute.OSProfileArgs(
            computer_name=name,
            admin_username=ADMIN_USERNAME,
            custom_data=custom_data(user_data),
            linux_configuration=linux_configuration(network.admin_ssh_public_key),
        ),
        network_profile=azure.compute.NetworkProfileArgs(
            network_interfaces=[
                azure.compute.NetworkInterfaceReferenceArgs(id=nic.id, primary=True, delete_option="Detach")
            ]
        ),
        diagnostics_profile=boot_diagnostics(),
        identity=identity,
        tags=tags(ctx, **{"corral-role": role}),
        # ARM refuses to change customData of an existing VM (409
        # PropertyChangeNotAllowed) and a new image is a new VM: both roll
        # out one member at a time with `pulumi up --replace`, never by an
        # `up` that would touch every etcd member at once (as on AWS).
        opts=pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(ignore_changes=["osProfile.customData", "storageProfile.imageReference"])
        ),
    )


def subscription_of(resource_id: str) -> str:
    """`/subscriptions/<id>` of an ARM id (what subscription-scoped ids start with)."""
    parts = resource_id.split("/")
    return "/".join(parts[:3]) if len(parts) > 2 and parts[1].lower() == "subscriptions" else resource_id


def control_plane_nic(
    ctx: ClusterContext,
    network,
    name: str,
    zone: str,
    ip: str,
    vm_size: str,
    role: str,
    opts: pulumi.ResourceOptions,
    backend_pool_ids: Sequence[pulumi.Input[str]] = (),
) -> azure.network.NetworkInterface:
    """A NIC with the layout's fixed address in the zone's control subnet."""
    return azure.network.NetworkInterface(
        name,
        network_interface_name=name,
        resource_group_name=network.resource_group_name,
        location=location(ctx),
        enable_accelerated_networking=accelerated_networking(vm_size),
        ip_configurations=[
            azure.network.NetworkInterfaceIPConfigurationArgs(
                name="ipconfig",
                primary=True,
                private_ip_address_version="IPv4",
                private_ip_allocation_method="Static",
                private_ip_address=ip,
                subnet=azure.network.SubnetArgs(id=pick(network.control_subnet_ids, zone, "control subnet")),
                load_balancer_backend_address_pools=(
                    [azure.network.BackendAddressPoolArgs(id=pool) for pool in backend_pool_ids] or None
                ),
            )
        ],
        tags=tags(ctx, **{"corral-role": role}),
        opts=opts,
    )
