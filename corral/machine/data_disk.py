"""The etcd member's data disk: found at a stable path per cloud, formatted once, mounted by fstab.

Boot bounds (docs/cloud-nodes.md "Boot"): at first boot the script waits
DATA_DISK_WAIT_ATTEMPTS x 5 s for the device; at later boots its fstab mount
(nofail) waits DATA_DISK_DEVICE_TIMEOUT without holding up the boot.
"""

from __future__ import annotations

from .files import File, render
from .part import Part, Phase

DATA_DISK_WAIT_ATTEMPTS = 60
DATA_DISK_DEVICE_TIMEOUT = "2min"
SCRIPT = "/usr/local/sbin/corral-etcd-data-disk"

# How each cloud's etcd data disk shows up inside the machine, at a stable
# path, as the cloud packages attach it:
# - azure: the data disk at LUN 0 (corral/infra/azure/common.py ETCD_DISK_DEVICE);
# - aws: an NVMe namespace named after the volume id, which the instance tag
#   `corral-etcd-volume` holds (corral/infra/aws/etcd.py VOLUME_TAG);
# - gcp: the attached disk's device name `etcd-data` under /dev/disk/by-id/google-*.
AZURE_ETCD_DEVICE = "/dev/disk/azure/scsi1/lun0"
AWS_ETCD_VOLUME_TAG = "corral-etcd-volume"
GCP_ETCD_DEVICE_NAME = "etcd-data"
ETCD_DISK_LOCATORS = {
    "azure": f"DEVICE={AZURE_ETCD_DEVICE}",
    "aws": "\n".join((
        "# IMDSv2; the tag is readable once the instance's metadata tags are on.",
        "imds() {",
        "  local token",
        "  token=$(curl -fsS -X PUT http://169.254.169.254/latest/api/token \\",
        "    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')",
        "  curl -fsS -H \"X-aws-ec2-metadata-token: $token\" \"http://169.254.169.254/latest/meta-data/$1\"",
        "}",
        "VOLUME=''",
        "for _ in $(seq 1 60); do",
        f"  VOLUME=$(imds tags/instance/{AWS_ETCD_VOLUME_TAG}) && break",
        "  sleep 5",
        "done",
        f"[ -n \"$VOLUME\" ] || {{ echo 'no {AWS_ETCD_VOLUME_TAG} instance tag' >&2; exit 1; }}",
        "DEVICE=/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${VOLUME//-/}",
    )),
    "gcp": f"DEVICE=/dev/disk/by-id/google-{GCP_ETCD_DEVICE_NAME}",
}


def part(cloud: str, mount_point: str) -> Part:
    """Find the cloud's data disk, format it once and mount it at `mount_point`, first at boot."""
    script = render(
        "scripts/etcd-data-disk.sh.j2",
        locate_device=ETCD_DISK_LOCATORS[cloud],
        mount_point=mount_point,
        device_wait_attempts=DATA_DISK_WAIT_ATTEMPTS, device_timeout=DATA_DISK_DEVICE_TIMEOUT,
    )
    return Part((File(SCRIPT, script, "0755"),), (SCRIPT,), Phase.DISKS)
