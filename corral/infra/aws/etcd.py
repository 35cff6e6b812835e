"""etcd members: one instance per member, its data on a provisioned-IOPS EBS volume."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from corral.infra.platform import ClusterContext
from corral.model.layout import Machine

from .common import (
    CONTROL_ROOT_GIB,
    check_zone,
    metadata_options,
    node_image,
    pick,
    tags,
    user_data_base64,
)
from .network import Network
from .secrets import MachineRole

# EBS types etcd may sit on; only gp3 takes a throughput setting.
VOLUME_TYPES = ("gp3", "io1", "io2")
THROUGHPUT_TYPES = ("gp3",)
# The data volume's block device mapping. On Nitro instances (every type
# corral uses) it appears as an NVMe namespace, /dev/nvme1n1 or so, in no
# fixed order, and some AMIs make no /dev/sdf link; its stable name is
#   /dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol<volume id without '-'>
# and the volume id is an instance tag (VOLUME_TAG) readable from the
# instance metadata service at boot (instance metadata tags are on):
#   http://169.254.169.254/latest/meta-data/tags/instance/corral-etcd-volume
DATA_DEVICE = "/dev/sdf"
VOLUME_TAG = "corral-etcd-volume"
MOUNT_POINT = "/var/lib/etcd"
BY_ID_PREFIX = "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_"

# Shell for the bootstrap's etcd-data-disk.sh (`{{ locate_device }}`): sets
# DEVICE to the data volume's stable path. The script then waits for it to
# appear: the volume is attached after the instance starts.
LOCATE_DEVICE = f"""\
# AWS: the EBS data volume by id (instance tag {VOLUME_TAG}, IMDSv2).
IMDS=http://169.254.169.254/latest
TOKEN=$(curl -sf --retry 10 --retry-connrefused -X PUT "$IMDS/api/token" \\
  -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
VOLUME=$(curl -sf --retry 10 --retry-connrefused -H "X-aws-ec2-metadata-token: $TOKEN" \\
  "$IMDS/meta-data/tags/instance/{VOLUME_TAG}")
[ -n "$VOLUME" ] || {{ echo "instance tag {VOLUME_TAG} is missing" >&2; exit 1; }}
DEVICE="{BY_ID_PREFIX}${{VOLUME//-/}}"
"""


def etcd_volume_args(ctx: ClusterContext, zone: str) -> dict:
    """`aws.ebs.Volume` arguments for a member's data disk in `zone`."""
    disk = ctx.cluster.control_plane.etcd.disk
    if disk.type not in VOLUME_TYPES:
        raise ValueError(
            f"etcd disk type {disk.type!r} is not an AWS provisioned-IOPS type ({', '.join(VOLUME_TYPES)})"
        )
    args = {
        "availability_zone": zone,
        "type": disk.type,
        "size": disk.size_gib,
        "iops": disk.iops,
        "encrypted": True,
    }
    if disk.type in THROUGHPUT_TYPES and disk.throughput_mbps is not None:
        args["throughput"] = disk.throughput_mbps
    return args


def _check_metadata_tag_keys(instance_tags: dict) -> None:
    """With tags in instance metadata, EC2 rejects tag keys with '/' or spaces."""
    bad = [k for k in instance_tags if "/" in k or " " in k]
    if bad:
        raise ValueError(f"etcd instance tag keys {bad} may not contain '/' or spaces (instance metadata tags)")


class Etcd(pulumi.ComponentResource):
    """One instance per `members[i]` at its fixed address, with its EBS data volume.

    The volume is a separate resource (not a block device of the instance),
    so the data outlives the machine: `protect` stops `pulumi destroy` and
    `retain_on_delete` keeps it in AWS should the resource ever be removed
    from the program. It is attached at DATA_DEVICE; the bootstrap finds it
    by volume id (see VOLUME_TAG) and mounts it at /var/lib/etcd.

    Instances have termination protection (`disable_api_termination`), are
    replaced delete-first (their address is fixed), and ignore changes of
    AMI and user data: cloud-init only runs at first boot, and a new image
    must roll one member at a time (`pulumi up --replace <urn>` after
    lifting termination protection), never the whole quorum at once.

    Each member has its own IAM role (`identities`), which may only read
    the member's own secret (granted by SecretStore).

    Attributes: instances, volumes (member name -> resource), volume_ids
    (member name -> id), private_ips (member name -> address), disk_device
    (the by-id prefix; the full path ends in the volume id, see LOCATE_DEVICE).
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
        super().__init__("corral:aws:Etcd", name, None, opts)
        etcd = ctx.cluster.control_plane.etcd
        if len(user_data) != len(members):
            raise ValueError(f"{len(members)} etcd members but {len(user_data)} user data documents")
        image = node_image()

        self.instances: dict[str, aws.ec2.Instance] = {}
        self.volumes: dict[str, aws.ebs.Volume] = {}
        self.volume_ids: dict[str, pulumi.Output[str]] = {}
        self.private_ips: dict[str, str] = {}
        self.identities: dict[str, aws.iam.Role] = {}
        self.disk_device = BY_ID_PREFIX

        prefix = ctx.cluster.name + "-"
        for i, member in enumerate(members):
            check_zone(ctx, member.zone, f"etcd member {member.name}")
            # "<cluster>-etcd-0" or "<cluster>-etcd-events-0": both etcd
            # clusters coexist, and the name is the layout's (certificates).
            vm_name = ctx.resource_name(member.name.removeprefix(prefix))
            volume = aws.ebs.Volume(
                f"{vm_name}-data",
                **etcd_volume_args(ctx, member.zone),
                tags=tags(ctx, f"{vm_name}-data", **{"corral-etcd-member": member.name}),
                opts=pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True),
            )
            # The member's own identity: it may read its own secret, nothing else
            # (no other policy is ever attached to it).
            machine = MachineRole(ctx, vm_name, f"etcd member {member.name}: reads its own keys", self)
            instance_tags = tags(ctx, vm_name, **{"corral-role": "etcd", VOLUME_TAG: volume.id})
            _check_metadata_tag_keys(instance_tags)
            instance = aws.ec2.Instance(
                vm_name,
                ami=image,
                instance_type=etcd.machine_type,
                availability_zone=member.zone,
                subnet_id=network.control_subnet_ids[member.zone],
                private_ip=member.ip,
                vpc_security_group_ids=[network.etcd_security_group_id],
                iam_instance_profile=machine.profile.name,
                user_data_base64=user_data_base64(pick(user_data, i, "etcd user data")),
                disable_api_termination=True,
                ebs_optimized=True,
                metadata_options=metadata_options(tags_in_metadata=True),
                root_block_device={
                    "volume_type": "gp3",
                    "volume_size": CONTROL_ROOT_GIB,
                    "encrypted": True,
                    "delete_on_termination": True,
                },
                tags=instance_tags,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=network.egress,
                    delete_before_replace=True,
                    ignore_changes=["ami", "userData", "userDataBase64"],
                ),
            )
            aws.ec2.VolumeAttachment(
                f"{vm_name}-data",
                device_name=DATA_DEVICE,
                instance_id=instance.id,
                volume_id=volume.id,
                # Stop the member before the volume goes, never yank a mounted disk.
                stop_instance_before_detaching=True,
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.instances[member.name] = instance
            self.volumes[member.name] = volume
            self.volume_ids[member.name] = volume.id
            self.private_ips[member.name] = member.ip
            self.identities[member.name] = machine.role

        self.register_outputs({"private_ips": self.private_ips, "volume_ids": self.volume_ids})
