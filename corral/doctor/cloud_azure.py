"""Azure: the az login and subscription, role assignments, the image and the vCPU quotas (read-only)."""

from __future__ import annotations

from .checks import Context, Finding, Status
from .images import boot_images
from .quota import machine_demand, verdict
from .runner import Unanswered

# The program creates role assignments (31 for jaguar: its identities' access
# to Key Vault secrets, the snapshot storage, the scale sets) and a custom role
# definition, so the deploying identity needs Microsoft.Authorization/
# roleAssignments/write and roleDefinitions/write besides creating resources.
# Built-in roles that give both (Azure RBAC built-in roles reference): Owner;
# or Contributor (everything but access management) with User Access
# Administrator or Role Based Access Control Administrator. Azure has no
# read-only "what if" for an identity's permissions, so a custom role cannot
# be judged here: the check warns instead of guessing.
CREATES = "Contributor"
GRANTS = ("User Access Administrator", "Role Based Access Control Administrator")
EVERYTHING = "Owner"


def _subscription(ctx: Context) -> str | None:
    return (ctx.cloud_identity or {}).get("id")


def check_credentials(ctx: Context) -> list[Finding]:
    try:
        # id, name, tenantId, user.name, user.type (az account show).
        answer = ctx.cli.run(["az", "account", "show", "--output", "json"])
        if not answer.ok:
            return [Finding("cloud.credentials", Status.fail, f"az is not logged in: {answer.error_line()}",
                            "az login, then az account set --subscription SUBSCRIPTION")]
        account = answer.json()
    except Unanswered as why:
        return [Finding("cloud.credentials", Status.fail, str(why), why.fix)]
    if not isinstance(account, dict) or not account.get("id"):
        return [Finding("cloud.credentials", Status.fail, "`az account show` named no subscription", "az login")]
    pinned = ctx.config("azure-native:subscriptionId")
    if pinned and str(pinned).lower() != str(account["id"]).lower():
        return [Finding("cloud.credentials", Status.fail,
                        f"az uses subscription {account['id']}, the stack pins {pinned}",
                        f"az account set --subscription {pinned}")]
    ctx.cloud_identity = account
    user = account.get("user") or {}
    return [Finding("cloud.credentials", Status.passed,
                    f"subscription {account.get('name')} ({account['id']}) as {user.get('type', 'user')} "
                    f"{user.get('name', '?')}")]


def check_permissions(ctx: Context) -> list[Finding]:
    if not ctx.cloud_identity:
        return [Finding("cloud.permissions", Status.skip, "needs an Azure login (see cloud.credentials)")]
    assignee = (ctx.cloud_identity.get("user") or {}).get("name")
    scope = f"/subscriptions/{_subscription(ctx)}"
    try:
        # [].roleDefinitionName, [].scope (az role assignment list; --include-inherited
        # adds assignments at the management groups above, --include-groups those
        # of the user's groups).
        answer = ctx.cli.run(["az", "role", "assignment", "list", "--assignee", str(assignee), "--scope", scope,
                              "--include-inherited", "--include-groups", "--output", "json"])
        if not answer.ok:
            return [Finding("cloud.permissions", Status.warn, f"cannot list {assignee}'s role assignments: "
                            f"{answer.error_line()}", "check the roles by hand (docs/doctor.md)")]
        roles = {str(row.get("roleDefinitionName")) for row in answer.json() or [] if isinstance(row, dict)}
    except Unanswered as why:
        return [Finding("cloud.permissions", Status.fail, str(why), why.fix)]
    fix = f"az role assignment create --assignee {assignee} --role Owner --scope {scope}  (or Contributor + User Access Administrator)"
    if EVERYTHING in roles or (CREATES in roles and roles & set(GRANTS)):
        return [Finding("cloud.permissions", Status.passed, f"{assignee} holds {', '.join(sorted(roles))} on {scope}")]
    if not roles:
        return [Finding("cloud.permissions", Status.fail, f"{assignee} holds no role on {scope}", fix)]
    if roles <= {CREATES, "Reader"} or roles <= set(GRANTS) | {"Reader"}:
        return [Finding("cloud.permissions", Status.fail, f"{assignee} holds only {', '.join(sorted(roles))} on "
                        f"{scope}: it cannot both create resources and the program's role assignments", fix)]
    return [Finding("cloud.permissions", Status.warn, f"{assignee} holds {', '.join(sorted(roles))} on {scope}: "
                    "custom roles cannot be checked without changing anything", fix)]


def image_urn() -> str | None:
    """Publisher:Offer:Sku:Version of the Marketplace image a machine boots when the
    stack sets no `corral:nodeImage` (corral/infra/azure/common.py MARKETPLACE_IMAGE);
    None without the azure extra."""
    from corral.infra.extras import provider_installed

    if not provider_installed("azure"):
        return None
    import pulumi

    from corral.infra.azure.common import MARKETPLACE_IMAGE

    return ":".join(str(pulumi.get(MARKETPLACE_IMAGE, key)) for key in ("publisher", "offer", "sku", "version"))


def describe_image(ctx: Context, image: str, users: list[str]) -> Finding:
    """An image the stack names by ARM id (a managed image or a gallery image [version])."""
    fix = (f"build one (node-images/README.md, -only=azure-arm.gpu-node), then pulumi config set -s {ctx.name} "
           "corral:nodeImage /subscriptions/.../providers/Microsoft.Compute/images/NAME")
    try:
        # Any ARM resource by id (Azure CLI, `az resource show --ids ID`); managed images,
        # gallery images and image versions report properties.provisioningState, "Succeeded"
        # once usable (GalleryImageVersion.provisioning_state, azure-mgmt-compute).
        answer = ctx.cli.run(["az", "resource", "show", "--ids", image, "--output", "json"])
        found = answer.json() if answer.ok else None
    except Unanswered as why:
        return Finding("cloud.images", Status.fail, f"{image}: {why}", why.fix)
    if not isinstance(found, dict):
        why = answer.error_line() if not answer.ok else "no such image"
        return Finding("cloud.images", Status.fail, f"{image} (booted by {', '.join(users)}) not found: {why}", fix)
    properties = found.get("properties") if isinstance(found.get("properties"), dict) else {}
    state = properties.get("provisioningState")
    status = Status.passed if state == "Succeeded" else Status.fail
    return Finding("cloud.images", status, f"{image} is {state} (booted by {', '.join(users)})",
                   "" if status is Status.passed else fix)


def check_marketplace_image(ctx: Context, booted_by: str) -> Finding:
    urn = image_urn()
    if urn is None:
        return Finding("cloud.images", Status.skip, "needs the azure extra (see cloud.extra)")
    region = ctx.cluster.control_plane.region
    try:
        # az vm image show --urn PUBLISHER:OFFER:SKU:VERSION ("latest" allowed) --location.
        answer = ctx.cli.run(["az", "vm", "image", "show", "--urn", urn, "--location", region, "--output", "json"])
    except Unanswered as why:
        return Finding("cloud.images", Status.fail, str(why), why.fix)
    if not answer.ok:
        return Finding("cloud.images", Status.fail, f"{urn} is not offered in {region}: {answer.error_line()}",
                       f"pulumi config set -s {ctx.name} corral:nodeImage IMAGE-ID (an image of yours, node-images/)")
    return Finding("cloud.images", Status.passed, f"{urn} is offered in {region} ({booted_by})")


def check_images(ctx: Context) -> list[Finding]:
    """The images the stack sets (as on AWS and GCP), and the Marketplace image
    while `corral:nodeImage` is unset (the control plane and CPU pools boot it then)."""
    if not ctx.cloud_identity:
        return [Finding("cloud.images", Status.skip, "needs an Azure login (see cloud.credentials)")]
    images = boot_images(ctx)
    findings = [describe_image(ctx, image, users) for image, users in images.items()]
    if not ctx.config("corral:nodeImage"):
        findings.append(check_marketplace_image(
            ctx, "the control plane and CPU pools boot it" if images else "every machine boots it"))
    return findings


def check_quotas(ctx: Context) -> list[Finding]:
    if not ctx.cloud_identity:
        return [Finding("cloud.quotas", Status.skip, "needs an Azure login (see cloud.credentials)")]
    region = ctx.cluster.control_plane.region
    findings: list[Finding] = []
    need: dict[str, list[int]] = {}
    try:
        # [].name.value (e.g. standardDSv5Family, cores, lowPriorityCores), .limit,
        # .currentValue (az vm list-usage; ARM Usage - List).
        usage = ctx.cli.run(["az", "vm", "list-usage", "--location", region, "--output", "json"])
        if not usage.ok:
            return [Finding("cloud.quotas", Status.fail, f"cannot read {region}'s usage: {usage.error_line()}",
                            "az provider register --namespace Microsoft.Compute")]
        limits = {str((row.get("name") or {}).get("value")): float(row["limit"]) for row in usage.json() or []}
        for d in machine_demand(ctx.cluster):
            # [].name, .family, .capabilities[name=vCPUs] (az vm list-skus; ARM Resource Skus - List).
            answer = ctx.cli.run(["az", "vm", "list-skus", "--location", region, "--size", d.machine_type,
                                  "--resource-type", "virtualMachines", "--output", "json"])
            sku = next((s for s in (answer.json() if answer.ok else []) or [] if s.get("name") == d.machine_type), None)
            if sku is None:
                findings.append(Finding("cloud.quotas", Status.fail, f"{d.machine_type} is not offered in {region}",
                                        f"choose another machine type in clusters/{ctx.name}.yaml"))
                continue
            vcpus = int(next(c["value"] for c in sku.get("capabilities") or [] if c.get("name") == "vCPUs"))
            for metric in (("lowPriorityCores",) if d.spot else (str(sku.get("family")), "cores")):
                totals = need.setdefault(metric, [0, 0])
                totals[0] += d.at_least * vcpus
                totals[1] += d.at_most * vcpus
    except (Unanswered, KeyError, TypeError, ValueError, StopIteration, AttributeError) as why:
        return findings + [Finding("cloud.quotas", Status.fail, f"cannot read the quotas: {why}", getattr(why, "fix", ""))]
    for metric, (at_least, at_most) in sorted(need.items()):
        if metric not in limits:
            findings.append(Finding("cloud.quotas", Status.skip, f"{region} lists no quota {metric}", ""))
            continue
        fix = f"request more {metric} vCPUs in {region} (Azure portal: Quotas, Compute)"
        findings.append(verdict("cloud.quotas", f"{metric} vCPUs in {region}", limits[metric], at_least, at_most, fix))
    return findings
