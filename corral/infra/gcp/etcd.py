"""etcd members: one VM per member, each with a provisioned-IOPS data disk."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from corral.infra.platform import ClusterContext
from corral.model.disks import DISK_TYPES, disk_types_for
from corral.model.layout import Machine

from .common import (
    CONTROL_ROOT_GIB,
    TAG_ETCD,
    boot_disk_type,
    check_disk_attachable,
    check_zone,
    gce_name,
    instance_metadata,
    labels,
    node_image,
    pick,
    shielded_vm,
)
from .network import Network
from .secrets import machine_account

# The data disk's device name. GCE exposes an attached disk as
# /dev/disk/by-id/google-<device_name> (udev rules of Google's guest
# environment, for SCSI and NVMe alike; Hyperdisk is NVMe on C3/N4 and
# friends), so the bootstrap formats and mounts /var/lib/etcd from
# ETCD_DEVICE_PATH whatever /dev/sdX or /dev/nvme0nXn1 the kernel picked.
ETCD_DEVICE_NAME = "etcd-data"
ETCD_DEVICE_PATH = f"/dev/disk/by-id/google-{ETCD_DEVICE_NAME}"


def data_disk_args(ctx: ClusterContext) -> dict:
    """Type, size and provisioned performance of an etcd data disk.

    hyperdisk-balanced takes IOPS and throughput; hyperdisk-extreme and
    pd-extreme take IOPS only (throughput follows from it, and GCE rejects a
    throughput setting on them). Hyperdisk performance can be changed in place
    but at most once every 4 hours (REFERENCE.md): a second `pulumi up` that
    changes IOPS within that window fails at the API, without touching data.
    """
    disk = ctx.cluster.control_plane.etcd.disk
    kind = DISK_TYPES.get(disk.type or "")
    if kind is None or kind.cloud != "gcp":
        raise ValueError(
            f"etcd disk type {disk.type!r} is not a GCP provisioned-IOPS type "
            f"({', '.join(disk_types_for('gcp'))})"
        )
    args: dict = {"type": kind.name, "size": disk.size_gib, "provisioned_iops": disk.iops}
    if kind.takes_throughput and disk.throughput_mbps is not None:
        args["provisioned_throughput"] = disk.throughput_mbps
    return args


class Etcd(pulumi.ComponentResource):
    """One VM per member in the member's zone, at the member's fixed address.

    Each member has a data disk of `controlPlane.etcd.disk` in its zone,
    attached as device `etcd-data` (see ETCD_DEVICE_PATH), protected twice:
    Pulumi `protect` (no `pulumi up`/`destroy` deletes it) and
    `retain_on_delete` (should protection be lifted, Pulumi forgets the disk
    and GCE keeps it). The VM has GCE deletion protection too, so replacing a
    member (a new image) takes a deliberate step: lift it, and the new VM
    attaches the same disk, keeping the member's data. Machine-type changes
    happen in place (stop, resize, start).

    Machine type: Hyperdisk attaches only to the newer series (C3, C3D, C4,
    N4, M3, Z3, ...; not N1/N2/E2), pd-extreme to N2 with 64+ vCPUs and M1-M3.
    The model does not check families; a warning here names a mismatch
    before `pulumi up` fails on it.

    Each member runs as its own service account (`identities`: member
    name -> email), which may read only that member's secret.

    Attributes: instances (member name -> gcp.compute.Instance),
    disks (member name -> gcp.compute.Disk), addresses (member name -> IP),
    device_path (where the data disk appears on the member).
    """

    def __init__(
        self,
        name: str,
        ctx: ClusterContext,
        network: Network,
        members: Sequence[Machine],
        user_data: Sequence[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("corral:gcp:Etcd", name, None, opts)
        etcd = ctx.cluster.control_plane.etcd
        disk_args = data_disk_args(ctx)
        check_disk_attachable(disk_args["type"], etcd.machine_type, f"etcd ({name})")
        image = node_image()
        role = gce_name(name)  # "etcd", "etcd-events": also a label value

        self.instances: dict[str, gcp.compute.Instance] = {}
        self.disks: dict[str, gcp.compute.Disk] = {}
        self.addresses: dict[str, str] = {}
        self.identities: dict[str, pulumi.Output[str]] = {}
        self.device_path = ETCD_DEVICE_PATH

        for i, member in enumerate(members):
            check_zone(ctx, member.zone, f"etcd member {member.name}")
            vm_name = gce_name(member.name)
            disk_name = gce_name(f"{member.name}-data")
            member_labels = labels(ctx, corral_role=role, corral_member=vm_name)
            # The member's own service account: no project role at all, only
            # read of its own secret (SecretStore.grant).
            account = machine_account(
                ctx, (member.name.removeprefix(ctx.cluster.name + "-"),), f"etcd member {member.name}", self,
            )

            disk = gcp.compute.Disk(
                disk_name,
                name=disk_name,
                description=f"etcd data of {member.name} (/var/lib/etcd)",
                zone=member.zone,
                labels=member_labels,
                **disk_args,
                opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
            )
            instance = gcp.compute.Instance(
                vm_name,
                name=vm_name,
                description=f"etcd member {i} of {ctx.cluster.name} ({role})",
                zone=member.zone,
                machine_type=etcd.machine_type,
                boot_disk={
                    "auto_delete": True,
                    "initialize_params": {
                        "image": image,
                        "size": CONTROL_ROOT_GIB,
                        "type": boot_disk_type(etcd.machine_type),
                    },
                },
                attached_disks=[{
                    "source": disk.self_link,
                    "device_name": ETCD_DEVICE_NAME,
                    "mode": "READ_WRITE",
                }],
                network_interfaces=[{
                    "subnetwork": pick(network.control_subnets, member.zone, "control subnet"),
                    "network_ip": member.ip,
                }],
                tags=[TAG_ETCD],
                labels=member_labels,
                metadata=instance_metadata(pick(user_data, i, "etcd user data")),
                service_account={
                    "email": account.email,
                    # Access is decided by IAM: the account holds one secret's read.
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                },
                shielded_instance_config=shielded_vm(),
                scheduling={"on_host_maintenance": "MIGRATE", "automatic_restart": True},
                deletion_protection=True,
                # Machine type changes stop and start the VM instead of failing.
                allow_stopping_for_update=True,
                opts=pulumi.ResourceOptions(parent=self, depends_on=network.egress),
            )
            self.instances[member.name] = instance
            self.disks[member.name] = disk
            self.addresses[member.name] = member.ip
            self.identities[member.name] = account.email

        self.register_outputs({
            "addresses": self.addresses,
            "device_path": self.device_path,
        })
