"""What the GCP components share: stack settings, names, labels, machine facts.

Stack settings (`stacks/Pulumi.<cluster>.yaml`; none is required for
`corral plan`):

    gcp:project            the project every resource lands in. Resources do
                           not name it: the default provider takes it from
                           here, so the program never hard-codes a project.
    gcp:region             optional; must equal `controlPlane.region` when set
                           (checked here). Regional resources name the
                           cluster's region explicitly.
    corral:nodeImage       boot image of every machine (etcd, API servers,
                           nodes), as GCE takes it: `projects/P/global/images/
                           family/F`, `P/F` or a full image URL. It must run
                           cloud-init with the GCE data source (it reads the
                           `user-data` metadata key) and Google's guest
                           environment (google-guest-agent for the internal
                           load balancer's local route; google-guest-configs
                           for the /dev/disk/by-id/google-* names). Default
                           `UNSET_IMAGE`, a deliberately non-existent image:
                           the plan stays deterministic offline and a real
                           `pulumi up` without the setting fails at the first
                           instance (a warning says so at preview).
    corral:gpuNodeImage    boot image of GPU pools (NVIDIA driver baked in);
                           default: `corral:nodeImage`.
    corral:cloudRouterAsn  BGP ASN of the VPN's Cloud Router (default 64514,
                           a private ASN; it must differ from every site's).
    corral:gpuSecureBoot   Secure Boot on GPU machines too (default false: the
                           NVIDIA modules node images build with DKMS are
                           unsigned); see `shielded_vm`.
"""

from __future__ import annotations

import re

import pulumi

from corral.infra import platform
from corral.infra.platform import check_zone, pick  # noqa: F401 (used by the components)
from corral.infra.platform import ClusterContext, warn_once
from corral.model.disks import DISK_TYPES, machine_series

# Not an image anyone publishes: the shape of a real family path.
UNSET_IMAGE = "projects/corral-unset/global/images/family/corral-node"
DEFAULT_CLOUD_ROUTER_ASN = 64514
# Boot disks of control-plane machines (etcd data lives on its own disk).
CONTROL_ROOT_GIB = 100

# Network tags: firewall rules select machines by these (GCP tags are
# per-network, and every cluster has its own VPC, so plain names suffice).
TAG_ETCD = "etcd"
TAG_APISERVER = "apiserver"
TAG_NODE = "node"

# GCE resource names (RFC 1035 labels, at most 63 characters).
_GCE_NAME = re.compile(r"\A[a-z]([-a-z0-9]*[a-z0-9])?\Z")
GCE_NAME_MAX = 63
# A MIG appends "-xxxx" to its base instance name, which GCE caps at 58.
BASE_INSTANCE_NAME_MAX = 58
# GCE labels: keys start with a lower-case letter; keys and values are at
# most 63 characters of lower-case letters, digits, '_' and '-'.
_LABEL_KEY = re.compile(r"\A[a-z][a-z0-9_-]{0,62}\Z")
_LABEL_VALUE = re.compile(r"\A[a-z0-9_-]{0,63}\Z")


# Shielded VM on every instance and template: Secure Boot (only signed boot
# code and kernel modules), a vTPM (measured boot) and integrity monitoring
# (Cloud Logging reports a boot that differs from the baseline).
SHIELDED_VM = {"enable_secure_boot": True, "enable_vtpm": True, "enable_integrity_monitoring": True}


def shielded_vm(gpu: bool = False) -> dict:
    """Shielded VM settings. GPU machines keep vTPM and integrity monitoring, and
    Secure Boot only when `corral:gpuSecureBoot` is true: the NVIDIA kernel
    modules the node images build with DKMS are unsigned, and Secure Boot
    refuses to load them (turn it on with an image whose modules are signed)."""
    if gpu and not config().get_bool("gpuSecureBoot"):
        return {**SHIELDED_VM, "enable_secure_boot": False}
    return dict(SHIELDED_VM)


def instance_metadata(user_data: pulumi.Input[str], **extra: pulumi.Input[str]) -> dict:
    """Instance metadata: the user data (references only, never a secret), and
    no project-wide SSH keys: a key added to the project must not open every
    control-plane machine."""
    return {"user-data": user_data, "block-project-ssh-keys": "true", **extra}


def config() -> pulumi.Config:
    return pulumi.Config("corral")


def node_image(gpu: bool = False) -> str:
    """The boot image of a machine; see the module docstring."""
    cfg = config()
    image = (cfg.get("gpuNodeImage") if gpu else None) or cfg.get("nodeImage")
    if image:
        return image
    warn_once(
        "corral:nodeImage is not set: instances boot the placeholder image "
        f"{UNSET_IMAGE}, which `pulumi up` cannot find. Set it with "
        "`pulumi config set corral:nodeImage projects/P/global/images/family/F` "
        "(an image from node-images/ with cloud-init and Google's guest environment)."
    )
    return UNSET_IMAGE


def cloud_router_asn() -> int:
    return config().get_int("cloudRouterAsn") or DEFAULT_CLOUD_ROUTER_ASN


def gce_name(name: str, limit: int = GCE_NAME_MAX) -> str:
    """`name`, checked against GCE's naming rule, or a ValueError saying why not."""
    if len(name) > limit or not _GCE_NAME.match(name):
        raise ValueError(
            f"'{name}' is not a valid GCE resource name: lower-case letters, digits and '-', "
            f"starting with a letter, at most {limit} characters (shorten the cluster or pool name)"
        )
    return name


def zone_suffix(zone: str) -> str:
    """`a` of `us-central1-a`: what names a zone's resources within the region."""
    return zone.rsplit("-", 1)[-1]


def labels(ctx: ClusterContext, **extra: str) -> dict[str, str]:
    """The cluster's common labels plus `extra` (underscores in keys become '-')."""
    result = {**ctx.tags, **{k.replace("_", "-"): v for k, v in extra.items()}}
    for key, value in result.items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ValueError(f"GCE label {key}={value!r} breaks GCE's label rules (lower-case, [a-z0-9_-], <= 63)")
    return result


# --- Machine families -------------------------------------------------------
#
# What GCE accepts depends on the machine series (the part of the type before
# the first '-'). Figures from the Compute Engine docs ("Machine series
# support" of each disk type, "GPU machine types"); the model does not check
# machine families, so `pulumi up` would be the first to complain. These
# tables only drive warnings and defaults here: a stale table must not block
# a deploy the cloud would accept.

# Which series can attach which etcd disk type is the model's knowledge
# (corral/model/disks.py), checked by `corral validate`.
DISK_SERIES = {name: kind.attach_series for name, kind in DISK_TYPES.items() if kind.attach_series is not None}
# Series that take no Persistent Disk at all: their boot disk must be a
# Hyperdisk too.
HYPERDISK_ONLY_SERIES = frozenset({"a4", "a4x", "c4", "c4a", "c4d", "h4d", "m4", "n4", "n4a", "n4d", "x4"})
# Series whose machine types come with their GPUs (a2-highgpu-8g has eight
# A100s, g2-standard-48 four L4s): instance templates must not add
# guest_accelerators for them.
GPU_BUNDLED_SERIES = frozenset({"a2", "a3", "a4", "a4x", "g2", "g4"})
# N1 is the only series that takes attachable GPUs, by accelerator type.
ATTACHABLE_GPUS = {
    "t4": "nvidia-tesla-t4",
    "v100": "nvidia-tesla-v100",
    "p100": "nvidia-tesla-p100",
    "p4": "nvidia-tesla-p4",
}


series = machine_series


def boot_disk_type(machine_type: str) -> str:
    """pd-balanced, or hyperdisk-balanced on series that take no Persistent Disk."""
    return "hyperdisk-balanced" if series(machine_type) in HYPERDISK_ONLY_SERIES else "pd-balanced"


def check_disk_attachable(disk_type: str, machine_type: str, what: str) -> None:
    """Warn when GCE will refuse to attach `disk_type` to `machine_type`."""
    allowed = DISK_SERIES.get(disk_type)
    if allowed is not None and series(machine_type) not in allowed:
        warn_once(
            f"{what}: machine type {machine_type} ({series(machine_type).upper()}) cannot attach "
            f"{disk_type} disks per the Compute Engine docs; use e.g. "
            f"{'c3-highmem-8 or n4-highmem-8' if disk_type == 'hyperdisk-balanced' else 'a larger N2/M-series type'}"
        )


def check_region(ctx: ClusterContext) -> None:
    """The stack's provider region, when set, must be the cluster's region."""
    platform.check_region(ctx, "gcp")
