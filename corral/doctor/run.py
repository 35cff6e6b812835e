"""The checks in the order a first `corral up` meets them, for the cluster's cloud."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from corral.infra.extras import install_hint, provider_installed
from corral.model import Cluster

from . import cloud_aws, cloud_azure, cloud_gcp, onprem, pulumi_checks
from .checks import Context, Finding, Status
from .runner import Cli

CLOUD_CHECKS = {"aws": cloud_aws, "gcp": cloud_gcp, "azure": cloud_azure}


def check_extra(ctx: Context) -> list[Finding]:
    cloud = ctx.cluster.control_plane.cloud
    if provider_installed(cloud):
        return [Finding("cloud.extra", Status.passed, f"the {cloud} Pulumi provider is installed")]
    return [Finding("cloud.extra", Status.fail, f"the {cloud} Pulumi provider is not installed", install_hint(cloud))]


def checks_for(cluster: Cluster) -> list[Callable[[Context], list[Finding]]]:
    cloud = CLOUD_CHECKS[cluster.control_plane.cloud]
    return [pulumi_checks.check_cli, pulumi_checks.check_login, pulumi_checks.check_stack, pulumi_checks.check_config,
            check_extra, cloud.check_credentials, cloud.check_permissions, cloud.check_images, cloud.check_quotas,
            onprem.check_host_keys, onprem.check_hosts, onprem.check_vpn_peers]


def run_checks(cluster: Cluster, clusters_dir: Path, project_dir: Path, cli: Cli | None = None) -> list[Finding]:
    ctx = Context(cluster, Path(clusters_dir), Path(project_dir).resolve(), cli or Cli())
    findings: list[Finding] = []
    for check in checks_for(cluster):
        findings += check(ctx)
    return findings
