"""etcd members: one zonal VM per member, each with a provisioned-IOPS data disk."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_azure_native as azure

from corral.infra.platform import ClusterContext
from corral.model.disks import DISK_TYPES
from corral.model.layout import Machine

from .common import (
    ETCD_DISK_DEVICE,
    ETCD_DISK_LUN,
    control_plane_nic,
    control_plane_vm,
    location,
    tags,
)

ULTRA = "UltraSSD_LRS"
PREMIUM_V2 = "PremiumV2_LRS"
# etcd writes small fsync'd WAL records; 4 KiB sectors are the native size of
# both disk types (and the only size some Linux tools assume).
LOGICAL_SECTOR_BYTES = 4096


class Etcd(pulumi.ComponentResource):
    """One VM per member in the member's zone, with the fixed layout address.

    The data disk (Premium SSD v2 or Ultra Disk, with the cluster's size,
    IOPS and throughput) lives in the member's zone: both types attach only
    to zonal VMs, with host caching None. It is attached at LUN
    `ETCD_DISK_LUN`, which the bootstrap mounts at /var/lib/etcd through
    `/dev/disk/azure/scsi1/lun0`. The disk is protected and retained: neither
    `pulumi destroy` nor replacing the VM deletes etcd's data (the VM detaches
    it on delete).

    Each VM has a system-assigned managed identity (`identities`: member
    name -> principal id) that may read only the member's own secret.

    Attributes: vms / disks / nics (lists, member order), member_ips,
    disk_device (the path the bootstrap mounts), identities.
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network,
        members: Sequence[Machine],
        user_data: Sequence[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:azure:Etcd", name, None, opts)
        cp = ctx.cluster.control_plane
        disk_spec = cp.etcd.disk
        kind = DISK_TYPES.get(disk_spec.type)
        if kind is None or kind.cloud != "azure":
            raise ValueError(
                f"etcd disk type {disk_spec.type!r} is not an Azure provisioned-IOPS type "
                f"({PREMIUM_V2} or {ULTRA})"
            )
        if len(user_data) != len(members):
            raise ValueError(f"{len(members)} etcd members but {len(user_data)} user data documents")
        ultra = disk_spec.type == ULTRA
        prefix = ctx.cluster.name + "-"

        self.vms: list[azure.compute.VirtualMachine] = []
        self.disks: list[azure.compute.Disk] = []
        self.nics: list[azure.network.NetworkInterface] = []
        self.member_ips = [m.ip for m in members]
        self.identities: dict[str, pulumi.Output[str]] = {}
        self.disk_device = ETCD_DISK_DEVICE

        for i, member in enumerate(members):
            # member.name is "<cluster>-etcd-0" (or "-etcd-events-0"): named
            # through ctx.resource_name so both etcd clusters coexist.
            suffix = member.name.removeprefix(prefix)
            vm_name = ctx.resource_name(suffix)

            disk = azure.compute.Disk(
                ctx.resource_name(suffix, "data"),
                disk_name=ctx.resource_name(suffix, "data"),
                resource_group_name=network.resource_group_name,
                location=location(ctx),
                zones=[member.zone],
                sku=azure.compute.DiskSkuArgs(name=disk_spec.type),
                creation_data=azure.compute.CreationDataArgs(
                    create_option="Empty",
                    logical_sector_size=LOGICAL_SECTOR_BYTES,
                ),
                disk_size_gb=disk_spec.size_gib,
                disk_iops_read_write=disk_spec.iops,
                # The model only sets throughput on types that take it
                # (both Azure types do).
                disk_m_bps_read_write=disk_spec.throughput_mbps if kind.takes_throughput else None,
                # Reachable only through the VM it is attached to.
                network_access_policy="DenyAll",
                public_network_access="Disabled",
                tags=tags(ctx, **{"corral-role": "etcd-data"}),
                opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
            )
            nic = control_plane_nic(
                ctx, network, ctx.resource_name(suffix, "nic"), member.zone, member.ip,
                cp.etcd.machine_type, "etcd",
                pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
            vm = control_plane_vm(
                ctx, network, vm_name, member.zone, cp.etcd.machine_type, nic, user_data[i], "etcd",
                pulumi.ResourceOptions(parent=self, delete_before_replace=True, depends_on=network.egress),
                data_disks=[
                    azure.compute.DataDiskArgs(
                        lun=ETCD_DISK_LUN,
                        name=ctx.resource_name(suffix, "data"),
                        create_option="Attach",
                        caching="None",
                        # Deleting the VM leaves etcd's data behind.
                        delete_option="Detach",
                        managed_disk=azure.compute.ManagedDiskParametersArgs(
                            id=disk.id,
                            storage_account_type=disk_spec.type,
                        ),
                    )
                ],
                ultra_ssd=ultra,
                # Its own identity: it may read the member's own secret, nothing else.
                identity=azure.compute.VirtualMachineIdentityArgs(type="SystemAssigned"),
            )
            self.identities[member.name] = vm.identity.apply(lambda identity: identity.principal_id if identity else None)
            self.disks.append(disk)
            self.nics.append(nic)
            self.vms.append(vm)

        self.register_outputs({
            "vm_ids": [vm.id for vm in self.vms],
            "disk_ids": [d.id for d in self.disks],
            "member_ips": self.member_ips,
        })
