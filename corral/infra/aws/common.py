"""What the AWS components share: stack settings, tags, user data, checks.

Stack settings (`stacks/Pulumi.<cluster>.yaml`; none is required for
`corral plan`):

    aws:region             the provider's region; must equal
                           `controlPlane.region` when set (checked here, never
                           written from code).
    corral:nodeImage       AMI id of every machine (etcd, API servers, nodes).
                           Default `UNSET_IMAGE`, a deliberately non-existent
                           id: the plan stays deterministic offline, and a real
                           `pulumi up` without the setting fails at the first
                           instance (a warning says so at preview).
    corral:gpuNodeImage    AMI id of GPU pools (NVIDIA driver baked in);
                           default: `corral:nodeImage`.
    corral:rootDeviceName  the AMI's root device, which launch templates must
                           name to size the root disk (another name adds a
                           second, empty volume instead): `/dev/xvda` (the
                           default: Debian 12, which node-images/ builds on,
                           and Amazon Linux) or `/dev/sda1` (Ubuntu).
    corral:amazonSideAsn   BGP ASN of the VPN gateway (default 64512).
"""

from __future__ import annotations

import base64
import gzip

import pulumi

from corral.infra import platform
from corral.infra.platform import check_zone, pick  # noqa: F401 (used by the components)
from corral.infra.platform import ClusterContext, warn_once

# Not an AMI anyone owns: `ami-` and 17 zeros, the shape of a real id.
UNSET_IMAGE = "ami-00000000000000000"
DEFAULT_ROOT_DEVICE = "/dev/xvda"  # node-images/gpu-node.pkr.hcl: Debian 12
DEFAULT_AMAZON_SIDE_ASN = 64512
# EC2 takes at most 16 KiB of user data (before base64).
USER_DATA_LIMIT = 16 * 1024
# Root disks of control-plane machines (etcd data lives on its own volume).
CONTROL_ROOT_GIB = 100

def config() -> pulumi.Config:
    return pulumi.Config("corral")


def node_image(gpu: bool = False) -> str:
    """The AMI for a machine; see the module docstring."""
    cfg = config()
    image = (cfg.get("gpuNodeImage") if gpu else None) or cfg.get("nodeImage")
    if image:
        return image
    warn_once(
        "corral:nodeImage is not set: instances use the placeholder AMI "
        f"{UNSET_IMAGE}, which `pulumi up` cannot launch. Set it with "
        "`pulumi config set corral:nodeImage ami-...` (an image from node-images/)."
    )
    return UNSET_IMAGE


def root_device_name() -> str:
    return config().get("rootDeviceName") or DEFAULT_ROOT_DEVICE


def amazon_side_asn() -> int:
    return config().get_int("amazonSideAsn") or DEFAULT_AMAZON_SIDE_ASN


def check_region(ctx: ClusterContext) -> None:
    """The stack's provider region, when set, must be the cluster's region."""
    platform.check_region(ctx, "aws")


def tags(ctx: ClusterContext, name: str, **extra: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    """The cluster's common tags, `Name`, and any extra ones."""
    return {**ctx.tags, "Name": name, **extra}


def encode_user_data(text: str) -> str:
    """Base64 user data, gzipped (cloud-init reads both) when it would not fit."""
    raw = text.encode()
    if len(raw) > USER_DATA_LIMIT:
        raw = gzip.compress(raw, mtime=0)
        if len(raw) > USER_DATA_LIMIT:
            raise ValueError(
                f"user data is {len(raw):,} bytes even gzipped; EC2 takes at most {USER_DATA_LIMIT:,}"
            )
    return base64.b64encode(raw).decode()


def user_data_base64(user_data: pulumi.Input[str]) -> pulumi.Output[str]:
    """`user_data` (cloud-init, holding references to secrets, never secrets) as EC2 wants it."""
    return pulumi.Output.from_input(user_data).apply(encode_user_data)


def metadata_options(tags_in_metadata: bool = False) -> dict:
    """IMDSv2 only, one hop (containers cannot reach the instance's metadata)."""
    options = {
        "http_endpoint": "enabled",
        "http_tokens": "required",
        "http_put_response_hop_limit": 1,
    }
    if tags_in_metadata:
        options["instance_metadata_tags"] = "enabled"
    return options
