"""GCP: the gcloud login and project, the permissions, the images and the region's quotas (read-only)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

from .checks import Context, Finding, Status
from .images import each_boot_image
from .quota import machine_demand, verdict
from .runner import Unanswered

# The permissions `pulumi up` needs per resource type of the GCP program
# (corral/infra/gcp/*.py), named as the IAM permissions reference names them
# (cloud.google.com/iam/docs/permissions-reference); the create permission
# of each, plus setIamPolicy where the program grants roles and
# iam.serviceAccounts.actAs to run machines as their service accounts.
GCP_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "gcp:compute/network:Network": ("compute.networks.create",),
    "gcp:compute/subnetwork:Subnetwork": ("compute.subnetworks.create",),
    "gcp:compute/firewall:Firewall": ("compute.firewalls.create",),
    "gcp:compute/router:Router": ("compute.routers.create",),
    "gcp:compute/routerNat:RouterNat": ("compute.routers.update",),
    "gcp:compute/instance:Instance": ("compute.instances.create", "iam.serviceAccounts.actAs"),
    "gcp:compute/disk:Disk": ("compute.disks.create",),
    "gcp:compute/instanceTemplate:InstanceTemplate": ("compute.instanceTemplates.create",),
    "gcp:compute/instanceGroupManager:InstanceGroupManager": ("compute.instanceGroupManagers.create",),
    "gcp:compute/instanceGroup:InstanceGroup": ("compute.instanceGroups.create",),
    "gcp:compute/forwardingRule:ForwardingRule": ("compute.forwardingRules.create",),
    "gcp:compute/regionBackendService:RegionBackendService": ("compute.regionBackendServices.create",),
    "gcp:compute/regionHealthCheck:RegionHealthCheck": ("compute.regionHealthChecks.create",),
    "gcp:projects/iAMCustomRole:IAMCustomRole": ("iam.roles.create",),
    "gcp:projects/iAMMember:IAMMember": ("resourcemanager.projects.setIamPolicy",),
    "gcp:serviceaccount/account:Account": ("iam.serviceAccounts.create",),
    "gcp:serviceaccount/iAMMember:IAMMember": ("iam.serviceAccounts.setIamPolicy",),
    "gcp:secretmanager/secret:Secret": ("secretmanager.secrets.create",),
    "gcp:secretmanager/secretIamMember:SecretIamMember": ("secretmanager.secrets.setIamPolicy",),
    "gcp:secretmanager/secretVersion:SecretVersion": ("secretmanager.versions.add",),
    "gcp:storage/bucket:Bucket": ("storage.buckets.create",),
    "gcp:storage/bucketIAMMember:BucketIAMMember": ("storage.buckets.setIamPolicy",),
    "gcp:kms/keyRing:KeyRing": ("cloudkms.keyRings.create",),
    "gcp:kms/cryptoKey:CryptoKey": ("cloudkms.cryptoKeys.create",),
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": ("cloudkms.cryptoKeys.setIamPolicy",),
}
GCP_VPN_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "gcp:compute/haVpnGateway:HaVpnGateway": ("compute.vpnGateways.create",),
    "gcp:compute/externalVpnGateway:ExternalVpnGateway": ("compute.externalVpnGateways.create",),
    "gcp:compute/vPNTunnel:VPNTunnel": ("compute.vpnTunnels.create",),
}
# projects.testIamPermissions (Resource Manager v1): "Returns permissions that a
# caller has on the specified Project ... There are no permissions required for
# making this API call." A POST that changes nothing. No gcloud command calls it.
TEST_PERMISSIONS_URL = "https://cloudresourcemanager.googleapis.com/v1/projects/{project}:testIamPermissions"

# The regional GPU quota metrics of the GPU machine series (Compute Engine
# API, Quota.metric; spot machines draw on the PREEMPTIBLE_ metric).
GPU_QUOTA_METRICS = {"a2-highgpu": "NVIDIA_A100_GPUS", "a2-megagpu": "NVIDIA_A100_GPUS",
                     "a2-ultragpu": "NVIDIA_A100_80GB_GPUS", "g2-standard": "NVIDIA_L4_GPUS",
                     "a3-highgpu": "NVIDIA_H100_GPUS"}


def _project(ctx: Context) -> str | None:
    project = ctx.config("gcp:project")
    return project if isinstance(project, str) and project else None


def check_credentials(ctx: Context) -> list[Finding]:
    try:
        # [].account, [].status == "ACTIVE" (gcloud auth list --format=json).
        answer = ctx.cli.run(["gcloud", "auth", "list", "--format=json"])
        active = [a.get("account") for a in (answer.json() if answer.ok else []) or []
                  if isinstance(a, dict) and a.get("status") == "ACTIVE"]
        if not active:
            return [Finding("cloud.credentials", Status.fail, "gcloud has no active account",
                            "gcloud auth login && gcloud auth application-default login")]
        # Pulumi's GCP provider uses Application Default Credentials, not gcloud's
        # own login: a token printed here proves they exist (kept, never shown).
        adc = ctx.cli.run(["gcloud", "auth", "application-default", "print-access-token"])
    except Unanswered as why:
        return [Finding("cloud.credentials", Status.fail, str(why), why.fix)]
    if not adc.ok or not adc.stdout.strip():
        return [Finding("cloud.credentials", Status.fail,
                        f"no Application Default Credentials (what Pulumi's GCP provider uses): {adc.error_line()}",
                        "gcloud auth application-default login")]
    project = _project(ctx)
    if project is None:
        try:
            # The program takes the project from the stack only; gcloud's default helps pick it.
            default = ctx.cli.run(["gcloud", "config", "get-value", "project"]).stdout.strip()
        except Unanswered:
            default = ""
        return [Finding("cloud.credentials", Status.fail, f"gcloud account {active[0]}, but the stack names no "
                        "gcp:project" + (f" (gcloud's default project: {default})" if default else ""),
                        f"pulumi config set -s {ctx.name} gcp:project PROJECT")]
    ctx.cloud_identity = {"account": active[0], "project": project}
    ctx.notes = {"token": adc.stdout.strip()}
    return [Finding("cloud.credentials", Status.passed, f"gcloud account {active[0]}, project {project} "
                                                         "(Application Default Credentials present)")]


def needed_permissions(ctx: Context) -> list[str]:
    tables = [GCP_PERMISSIONS] + ([GCP_VPN_PERMISSIONS] if ctx.cluster.vpn_site_names else [])
    return sorted({p for table in tables for perms in table.values() for p in perms})


def check_permissions(ctx: Context, url: str = TEST_PERMISSIONS_URL) -> list[Finding]:
    if not ctx.cloud_identity or not ctx.notes:
        return [Finding("cloud.permissions", Status.skip, "needs GCP credentials (see cloud.credentials)")]
    project, wanted = ctx.cloud_identity["project"], needed_permissions(ctx)
    request = urllib.request.Request(url.format(project=project), method="POST",
                                     data=json.dumps({"permissions": wanted}).encode(),
                                     headers={"Authorization": f"Bearer {ctx.notes['token']}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=ctx.cli.timeout) as response:
            granted = set(json.loads(response.read().decode()).get("permissions") or [])
    except urllib.error.HTTPError as error:
        return [Finding("cloud.permissions", Status.warn, f"testIamPermissions on {project}: HTTP {error.code}",
                        "enable the Cloud Resource Manager API, or check the permissions by hand (docs/doctor.md)")]
    except (urllib.error.URLError, OSError, ValueError) as error:
        return [Finding("cloud.permissions", Status.warn, f"testIamPermissions on {project}: {error}",
                        "check the network, or the permissions by hand (docs/doctor.md)")]
    missing = [p for p in wanted if p not in granted]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        return [Finding("cloud.permissions", Status.fail,
                        f"{ctx.cloud_identity['account']} lacks {shown} on {project} ({len(missing)} of {len(wanted)})",
                        "grant a role with them (docs/doctor.md lists every permission by resource)")]
    return [Finding("cloud.permissions", Status.passed,
                    f"{ctx.cloud_identity['account']} holds all {len(wanted)} permissions on {project}")]


def image_command(image: str, project: str) -> list[str]:
    """`images describe` or `describe-from-family` for the forms corral:nodeImage takes
    (projects/P/global/images/[family/]NAME, a full URL of it, or P/FAMILY)."""
    path = image.split("/compute/v1/", 1)[-1]
    if m := re.fullmatch(r"projects/([^/]+)/global/images/family/([^/]+)", path):
        return ["gcloud", "compute", "images", "describe-from-family", m[2], f"--project={m[1]}", "--format=json"]
    if m := re.fullmatch(r"projects/([^/]+)/global/images/([^/]+)", path):
        return ["gcloud", "compute", "images", "describe", m[2], f"--project={m[1]}", "--format=json"]
    if m := re.fullmatch(r"([^/]+)/([^/]+)", path):
        return ["gcloud", "compute", "images", "describe-from-family", m[2], f"--project={m[1]}", "--format=json"]
    return ["gcloud", "compute", "images", "describe", path, f"--project={project}", "--format=json"]


def describe_image(ctx: Context, image: str, users: list[str]) -> Finding:
    fix = f"build one (node-images/README.md), then pulumi config set -s {ctx.name} corral:nodeImage IMAGE"
    try:
        # Image.name / .status READY (Compute Engine API images.get, getFromFamily).
        answer = ctx.cli.run(image_command(image, _project(ctx) or ""))
        found = answer.json() if answer.ok else None
    except Unanswered as why:
        return Finding("cloud.images", Status.fail, f"{image}: {why}", why.fix)
    if not isinstance(found, dict):
        return Finding("cloud.images", Status.fail, f"{image} (booted by {', '.join(users)}) not found: "
                       f"{answer.error_line()}", fix)
    status = Status.passed if found.get("status") == "READY" else Status.fail
    return Finding("cloud.images", status, f"{image} -> {found.get('name')} is {found.get('status')} "
                   f"(booted by {', '.join(users)})", "" if status is Status.passed else fix)


def check_images(ctx: Context) -> list[Finding]:
    return each_boot_image(ctx, describe_image)


def check_quotas(ctx: Context) -> list[Finding]:
    if not ctx.cloud_identity:
        return [Finding("cloud.quotas", Status.skip, "needs GCP credentials (see cloud.credentials)")]
    project, region = ctx.cloud_identity["project"], ctx.cluster.control_plane.region
    zone = ctx.cluster.control_plane.zones[0]
    try:
        # quotas[].metric / .limit / .usage (Compute Engine API regions.get, Quota).
        answer = ctx.cli.run(["gcloud", "compute", "regions", "describe", region, f"--project={project}",
                              "--format=json"])
        if not answer.ok:
            return [Finding("cloud.quotas", Status.fail, f"cannot read {region}'s quotas: {answer.error_line()}",
                            f"gcloud services enable compute.googleapis.com --project={project}")]
        limits = {q["metric"]: float(q["limit"]) for q in answer.json().get("quotas") or []}
    except (Unanswered, KeyError, TypeError, ValueError, AttributeError) as why:
        return [Finding("cloud.quotas", Status.fail, f"cannot read {region}'s quotas: {why}", getattr(why, "fix", ""))]
    need: dict[str, list[int]] = {}
    findings: list[Finding] = []
    for d in machine_demand(ctx.cluster):
        try:
            # guestCpus (Compute Engine API machineTypes.get).
            described = ctx.cli.run(["gcloud", "compute", "machine-types", "describe", d.machine_type,
                                     f"--zone={zone}", f"--project={project}", "--format=json"])
            cpus = int(described.json()["guestCpus"]) if described.ok else None
        except (Unanswered, KeyError, TypeError, ValueError) as why:
            findings.append(Finding("cloud.quotas", Status.fail, f"{d.machine_type}: {why}", getattr(why, "fix", "")))
            continue
        if cpus is None:
            findings.append(Finding("cloud.quotas", Status.fail, f"{d.machine_type} is not offered in {zone}: "
                                    f"{described.error_line()}", f"choose another machine type in clusters/{ctx.name}.yaml"))
            continue
        series = d.machine_type.split("-", 1)[0].upper()
        # vCPUs count against the series' metric (N2_CPUS, C3_CPUS, A2_CPUS ...), spot ones against PREEMPTIBLE_CPUS.
        metrics = [("PREEMPTIBLE_CPUS" if d.spot else f"{series}_CPUS", cpus)]
        gpu_metric = next((m for prefix, m in GPU_QUOTA_METRICS.items() if d.machine_type.startswith(prefix)), None)
        if d.gpus_each and gpu_metric:
            metrics.append((("PREEMPTIBLE_" if d.spot else "") + gpu_metric, d.gpus_each))
        for metric, each in metrics:
            totals = need.setdefault(metric, [0, 0])
            totals[0] += d.at_least * each
            totals[1] += d.at_most * each
    for metric, (at_least, at_most) in sorted(need.items()):
        fix = f"request more {metric} in {region}: https://console.cloud.google.com/iam-admin/quotas?project={project}"
        if metric not in limits:
            findings.append(Finding("cloud.quotas", Status.skip, f"{region} lists no quota {metric}", ""))
            continue
        findings.append(verdict("cloud.quotas", f"{metric} in {region}", limits[metric], at_least, at_most, fix))
    return findings
