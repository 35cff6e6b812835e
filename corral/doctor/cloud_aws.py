"""AWS: who the CLI is, what it may do, the AMIs, and the EC2 vCPU quotas (all read-only)."""

from __future__ import annotations

import re

from .checks import Context, Finding, Status
from .images import each_boot_image
from .quota import machine_demand, verdict
from .runner import Unanswered

# The IAM actions `pulumi up` needs for each resource type the AWS program
# registers (corral/infra/aws/*.py), as the AWS Service Authorization
# Reference names them (docs.aws.amazon.com/service-authorization/latest/
# reference: "Actions defined by Amazon EC2", "... Amazon EC2 Auto Scaling",
# "... AWS Identity and Access Management", "... Elastic Load Balancing V2",
# "... Amazon S3", "... AWS Secrets Manager", "... AWS Key Management
# Service"). The create calls only: an identity allowed to create is
# normally allowed to describe and delete as well, and the simulation is
# there to catch a missing grant, not to audit a policy.
# tests/doctor/test_cloud_aws.py holds this table to every AWS type in the plans.
AWS_ACTIONS: dict[str, tuple[str, ...]] = {
    "aws:ec2/vpc:Vpc": ("ec2:CreateVpc", "ec2:ModifyVpcAttribute", "ec2:CreateTags"),
    "aws:ec2/subnet:Subnet": ("ec2:CreateSubnet",),
    "aws:ec2/internetGateway:InternetGateway": ("ec2:CreateInternetGateway", "ec2:AttachInternetGateway"),
    "aws:ec2/eip:Eip": ("ec2:AllocateAddress",),
    "aws:ec2/natGateway:NatGateway": ("ec2:CreateNatGateway",),
    "aws:ec2/routeTable:RouteTable": ("ec2:CreateRouteTable",),
    "aws:ec2/route:Route": ("ec2:CreateRoute",),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": ("ec2:AssociateRouteTable",),
    "aws:ec2/securityGroup:SecurityGroup": ("ec2:CreateSecurityGroup",),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": ("ec2:AuthorizeSecurityGroupIngress",),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": ("ec2:AuthorizeSecurityGroupEgress",),
    "aws:ec2/instance:Instance": ("ec2:RunInstances", "iam:PassRole"),
    "aws:ebs/volume:Volume": ("ec2:CreateVolume",),
    "aws:ec2/volumeAttachment:VolumeAttachment": ("ec2:AttachVolume",),
    "aws:ec2/launchTemplate:LaunchTemplate": ("ec2:CreateLaunchTemplate",),
    "aws:autoscaling/group:Group": ("autoscaling:CreateAutoScalingGroup",),
    "aws:iam/role:Role": ("iam:CreateRole",),
    "aws:iam/rolePolicy:RolePolicy": ("iam:PutRolePolicy",),
    "aws:iam/instanceProfile:InstanceProfile": ("iam:CreateInstanceProfile", "iam:AddRoleToInstanceProfile"),
    "aws:lb/loadBalancer:LoadBalancer": ("elasticloadbalancing:CreateLoadBalancer",),
    "aws:lb/targetGroup:TargetGroup": ("elasticloadbalancing:CreateTargetGroup",),
    "aws:lb/listener:Listener": ("elasticloadbalancing:CreateListener",),
    "aws:lb/targetGroupAttachment:TargetGroupAttachment": ("elasticloadbalancing:RegisterTargets",),
    "aws:s3/bucket:Bucket": ("s3:CreateBucket",),
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": ("s3:PutLifecycleConfiguration",),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": ("s3:PutBucketPublicAccessBlock",),
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration":
        ("s3:PutEncryptionConfiguration",),
    "aws:s3/bucketVersioning:BucketVersioning": ("s3:PutBucketVersioning",),
    "aws:s3/bucketPolicy:BucketPolicy": ("s3:PutBucketPolicy",),
    "aws:secretsmanager/secret:Secret": ("secretsmanager:CreateSecret",),
    "aws:secretsmanager/secretVersion:SecretVersion": ("secretsmanager:PutSecretValue",),
    "aws:kms/key:Key": ("kms:CreateKey",),
    "aws:kms/alias:Alias": ("kms:CreateAlias",),
    "aws:kms/keyPolicy:KeyPolicy": ("kms:PutKeyPolicy",),
}
# Only a cluster with a site VPN registers these (corral/infra/aws/hybrid.py).
AWS_VPN_ACTIONS: dict[str, tuple[str, ...]] = {
    "aws:ec2/vpnGateway:VpnGateway": ("ec2:CreateVpnGateway",),
    "aws:ec2/vpnGatewayAttachment:VpnGatewayAttachment": ("ec2:AttachVpnGateway",),
    "aws:ec2/vpnGatewayRoutePropagation:VpnGatewayRoutePropagation": ("ec2:EnableVgwRoutePropagation",),
    "aws:ec2/customerGateway:CustomerGateway": ("ec2:CreateCustomerGateway",),
    "aws:ec2/vpnConnection:VpnConnection": ("ec2:CreateVpnConnection",),
}

# EC2's On-Demand and Spot vCPU quotas by instance family letters (Service
# Quotas, service code ec2): L-1216C47A "Running On-Demand Standard (A, C,
# D, H, I, M, R, T, Z) instances" (AWS CLI user guide, service-quotas
# examples), L-DB2E81BA "Running On-Demand G and VT instances", L-417A185B
# "Running On-Demand P instances", L-34B43A08 "All Standard (A, C, D, H, I,
# M, R, T, Z) Spot Instance Requests", L-3819A6DF "All G and VT Spot
# Instance Requests", L-7212CCBC "All P Spot Instance Requests".
STANDARD_FAMILIES = set("acdhimrtz")
QUOTA_CODES = {
    ("standard", False): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("g", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("p", False): ("L-417A185B", "Running On-Demand P instances"),
    ("standard", True): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
    ("g", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("p", True): ("L-7212CCBC", "All P Spot Instance Requests"),
}
ASSUMED_ROLE = re.compile(r"\Aarn:(?P<partition>aws[\w-]*):sts::(?P<account>\d{12}):assumed-role/(?P<role>[\w+=,.@-]+)/")


def quota_class(instance_type: str) -> str | None:
    """'standard', 'g' (G and VT) or 'p' by the instance type's family letters; None for the others."""
    letters = re.match(r"[a-z]+", instance_type.lower())
    family = letters[0] if letters else ""
    if family in ("g", "vt"):
        return "g"
    if family == "p":
        return "p"
    if len(family) == 1 and family in STANDARD_FAMILIES:
        return "standard"
    return None


def _region(ctx: Context) -> str:
    return ctx.cluster.control_plane.region


def check_credentials(ctx: Context) -> list[Finding]:
    try:
        # Fields Account, Arn, UserId (aws-cli: sts get-caller-identity).
        answer = ctx.cli.run(["aws", "sts", "get-caller-identity", "--region", _region(ctx), "--output", "json"])
        if not answer.ok:
            return [Finding("cloud.credentials", Status.fail, f"no usable AWS credentials: {answer.error_line()}",
                            "aws sso login --profile PROFILE (or aws configure), then export AWS_PROFILE=PROFILE")]
        who = answer.json()
    except Unanswered as why:
        return [Finding("cloud.credentials", Status.fail, str(why), why.fix)]
    if not isinstance(who, dict) or not who.get("Arn"):
        return [Finding("cloud.credentials", Status.fail, "`aws sts get-caller-identity` named no identity",
                        "aws configure")]
    ctx.cloud_identity = who
    return [Finding("cloud.credentials", Status.passed, f"AWS account {who.get('Account')} as {who['Arn']}")]


def needed_actions(ctx: Context) -> list[str]:
    tables = [AWS_ACTIONS] + ([AWS_VPN_ACTIONS] if ctx.cluster.vpn_site_names else [])
    return sorted({action for table in tables for actions in table.values() for action in actions})


def policy_source(arn: str) -> str | None:
    """The ARN IAM's simulator takes for the caller: an assumed role's session becomes its role."""
    if m := ASSUMED_ROLE.match(arn):
        # The role's path is not in the session ARN; a role under a path is
        # then not found, which the check reports as "cannot simulate".
        return f"arn:{m['partition']}:iam::{m['account']}:role/{m['role']}"
    if re.match(r"\Aarn:aws[\w-]*:iam::\d{12}:(user|role)/", arn):
        return arn
    return None


def check_permissions(ctx: Context) -> list[Finding]:
    if not ctx.cloud_identity:
        return [Finding("cloud.permissions", Status.skip, "needs AWS credentials (see cloud.credentials)")]
    arn = str(ctx.cloud_identity["Arn"])
    if arn.endswith(":root"):
        return [Finding("cloud.permissions", Status.warn, f"{arn} is the account's root user: every action is allowed",
                        "use an IAM role or IAM Identity Center user for corral, not the root user")]
    source = policy_source(arn)
    if source is None:
        return [Finding("cloud.permissions", Status.skip,
                        f"IAM's policy simulator cannot evaluate {arn} (only users and roles)",
                        "run as an IAM role or user to have doctor check its permissions")]
    actions = needed_actions(ctx)
    try:
        # EvaluationResults[].EvalActionName / .EvalDecision ("allowed",
        # "explicitDeny", "implicitDeny"): IAM API SimulatePrincipalPolicy.
        answer = ctx.cli.run(["aws", "iam", "simulate-principal-policy", "--policy-source-arn", source,
                              "--action-names", *actions, "--output", "json"])
        if not answer.ok:
            return [Finding("cloud.permissions", Status.warn,
                            f"cannot simulate {source}'s policies: {answer.error_line()}",
                            f"allow iam:SimulatePrincipalPolicy on {source} to let doctor check, "
                            "or compare its policies with docs/doctor.md")]
        results = answer.json()
    except Unanswered as why:
        return [Finding("cloud.permissions", Status.fail, str(why), why.fix)]
    decisions = {str(r.get("EvalActionName")): str(r.get("EvalDecision"))
                 for r in (results or {}).get("EvaluationResults") or [] if isinstance(r, dict)}
    denied = [action for action in actions if decisions.get(action) != "allowed"]
    if denied:
        shown = ", ".join(denied[:6]) + (f" and {len(denied) - 6} more" if len(denied) > 6 else "")
        return [Finding("cloud.permissions", Status.fail,
                        f"{source} may not {shown} ({len(denied)} of {len(actions)} actions the program needs)",
                        f"grant them to {source} (docs/doctor.md lists every action by resource)")]
    return [Finding("cloud.permissions", Status.passed,
                    f"{source} may call all {len(actions)} actions the program needs (IAM policy simulator)")]


def describe_image(ctx: Context, image: str, users: list[str]) -> Finding:
    fix = (f"build one (node-images/README.md) in {_region(ctx)}, then pulumi config set -s {ctx.name} "
           "corral:nodeImage ami-...")
    try:
        # Images[].State "available" (EC2 API DescribeImages, ImageState).
        answer = ctx.cli.run(["aws", "ec2", "describe-images", "--image-ids", image, "--region", _region(ctx),
                              "--output", "json"])
        rows = answer.json().get("Images") if answer.ok else None
    except (Unanswered, AttributeError) as why:
        return Finding("cloud.images", Status.fail, f"{image}: {why}", getattr(why, "fix", ""))
    if not answer.ok or not rows:
        why = answer.error_line() if not answer.ok else "no such image"
        return Finding("cloud.images", Status.fail,
                       f"{image} (booted by {', '.join(users)}) not found in {_region(ctx)}: {why}", fix)
    state = rows[0].get("State")
    status = Status.passed if state == "available" else Status.fail
    return Finding("cloud.images", status, f"{image} {rows[0].get('Name', '')} is {state} (booted by {', '.join(users)})",
                   "" if status is Status.passed else fix)


def check_images(ctx: Context) -> list[Finding]:
    return each_boot_image(ctx, describe_image)


def check_quotas(ctx: Context) -> list[Finding]:
    if not ctx.cloud_identity:
        return [Finding("cloud.quotas", Status.skip, "needs AWS credentials (see cloud.credentials)")]
    demand = machine_demand(ctx.cluster)
    region = _region(ctx)
    try:
        # InstanceTypes[].InstanceType / .VCpuInfo.DefaultVCpus (EC2 API DescribeInstanceTypes).
        answer = ctx.cli.run(["aws", "ec2", "describe-instance-types", "--instance-types",
                              *sorted({d.machine_type for d in demand}), "--region", region, "--output", "json"])
        if not answer.ok:
            return [Finding("cloud.quotas", Status.fail, f"cannot read the instance types: {answer.error_line()}",
                            f"check the machine types in clusters/{ctx.name}.yaml exist in {region}")]
        vcpus = {row["InstanceType"]: int(row["VCpuInfo"]["DefaultVCpus"])
                 for row in answer.json().get("InstanceTypes") or []}
    except (Unanswered, KeyError, TypeError, ValueError, AttributeError) as why:
        return [Finding("cloud.quotas", Status.fail, f"cannot read the instance types: {why}", getattr(why, "fix", ""))]
    findings: list[Finding] = []
    need: dict[tuple[str, bool], list[int]] = {}
    for d in demand:
        if d.machine_type not in vcpus:
            findings.append(Finding("cloud.quotas", Status.fail, f"{d.machine_type} is not offered in {region}",
                                    f"choose another machine type in clusters/{ctx.name}.yaml"))
            continue
        kind = quota_class(d.machine_type)
        if kind is None:
            findings.append(Finding("cloud.quotas", Status.skip,
                                    f"{d.machine_type}: corral knows no vCPU quota code for its family",
                                    "check it in the Service Quotas console"))
            continue
        totals = need.setdefault((kind, d.spot), [0, 0])
        totals[0] += d.at_least * vcpus[d.machine_type]
        totals[1] += d.at_most * vcpus[d.machine_type]
    for (kind, spot), (at_least, at_most) in sorted(need.items()):
        code, name = QUOTA_CODES[(kind, spot)]
        fix = (f"request more: aws service-quotas request-service-quota-increase --service-code ec2 "
               f"--quota-code {code} --desired-value {at_most} --region {region}")
        try:
            # Quota.Value (Service Quotas API GetServiceQuota).
            answer = ctx.cli.run(["aws", "service-quotas", "get-service-quota", "--service-code", "ec2",
                                  "--quota-code", code, "--region", region, "--output", "json"])
            if not answer.ok:
                findings.append(Finding("cloud.quotas", Status.warn, f"{name} ({code}): cannot read it: "
                                        f"{answer.error_line()}", "allow servicequotas:GetServiceQuota to check"))
                continue
            limit = float(answer.json()["Quota"]["Value"])
        except (Unanswered, KeyError, TypeError, ValueError) as why:
            findings.append(Finding("cloud.quotas", Status.fail, f"{name} ({code}): {why}", getattr(why, "fix", "")))
            continue
        findings.append(verdict("cloud.quotas", f"{name} ({code}), vCPUs in {region}", limit, at_least, at_most, fix))
    return findings
