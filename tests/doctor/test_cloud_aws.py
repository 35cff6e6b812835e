"""AWS: credentials, the IAM policy simulation, the AMIs and the EC2 vCPU quotas, against the fake aws CLI."""

from __future__ import annotations

import json
import sys

import pytest

from corral.doctor import Status
from corral.doctor.cloud_aws import (
    AWS_ACTIONS,
    AWS_VPN_ACTIONS,
    check_credentials,
    check_images,
    check_permissions,
    check_quotas,
    policy_source,
    quota_class,
)
from corral.doctor.pulumi_checks import check_config
from corral.doctor.run import check_extra

from .conftest import ACCOUNT, ROOT

ROLE = f"arn:aws:iam::{ACCOUNT}:role/corral-deployer"


def ready(world, name="heron"):
    ctx = world.context(name)
    check_config(ctx)
    check_credentials(ctx)
    return ctx


def test_every_aws_resource_type_the_program_plans_has_its_iam_actions():
    planned = {r["type"] for r in json.loads((ROOT / "tests/golden/plans/heron.json").read_text())["resources"]
               if r["type"].startswith("aws:")}
    assert planned and planned <= set(AWS_ACTIONS) | set(AWS_VPN_ACTIONS), planned - set(AWS_ACTIONS)
    # and every resource class the AWS program constructs (the VPN ones only with a site VPN)
    source = "".join(p.read_text() for p in (ROOT / "corral/infra/aws").glob("*.py"))
    for resource_type in [*AWS_ACTIONS, *AWS_VPN_ACTIONS]:
        module, name = resource_type.split(":")[1].split("/")[0], resource_type.split(":")[2]
        assert f"aws.{module}.{name}(" in source, resource_type


def test_credentials_name_account_and_caller(world):
    ctx = world.context("heron")
    assert [(f.status, f.finding) for f in check_credentials(ctx)] == [
        (Status.passed, f"AWS account {ACCOUNT} as arn:aws:sts::{ACCOUNT}:assumed-role/corral-deployer/alice")]
    world.state["aws"]["identity"] = None
    [found] = check_credentials(world.context("heron"))
    assert found.status is Status.fail and "Unable to locate credentials" in found.finding
    assert found.fix.startswith("aws sso login")


def test_an_assumed_role_is_simulated_as_its_role_and_passes_when_everything_is_allowed(world):
    assert policy_source(f"arn:aws:sts::{ACCOUNT}:assumed-role/corral-deployer/alice") == ROLE
    [found] = check_permissions(ready(world))
    assert found.status is Status.passed and found.finding.startswith(f"{ROLE} may call all ")
    [call] = [c for c in world.calls() if c[1:3] == ["iam", "simulate-principal-policy"]]
    assert call[call.index("--policy-source-arn") + 1] == ROLE
    assert "ec2:RunInstances" in call and "iam:PassRole" in call
    assert "ec2:CreateVpnConnection" not in call    # heron has no site VPN


def test_denied_actions_fail_naming_them(world):
    everything = sorted({a for actions in AWS_ACTIONS.values() for a in actions})
    world.state["aws"]["allowed"] = [a for a in everything if a not in ("iam:PassRole", "kms:CreateKey")]
    [found] = check_permissions(ready(world))
    assert found.status is Status.fail
    assert found.finding == f"{ROLE} may not iam:PassRole, kms:CreateKey (2 of {len(everything)} actions the program needs)"


def test_no_simulation_right_warns_and_the_root_user_warns(world):
    world.state["aws"]["simulate_error"] = ("An error occurred (AccessDenied) when calling the SimulatePrincipalPolicy "
                                            "operation: User is not authorized to perform: iam:SimulatePrincipalPolicy")
    [found] = check_permissions(ready(world))
    assert found.status is Status.warn and "iam:SimulatePrincipalPolicy" in found.fix
    world.state["aws"]["identity"]["Arn"] = f"arn:aws:iam::{ACCOUNT}:root"
    [root] = check_permissions(ready(world))
    assert root.status is Status.warn and "root user" in root.finding


def test_the_boot_images_exist_and_a_missing_ami_fails_naming_who_boots_it(world):
    assert [(f.status, f.finding) for f in check_images(ready(world))] == [
        (Status.passed, "ami-0123456789abcdef0 corral-node-k8s-1-30-8 is available (booted by control plane, cpu-m7i)"),
        (Status.passed, "ami-0fedcba9876543210 corral-gpu-node-k8s-1-30-8 is available "
                        "(booted by gpu-a10g, gpu-a10g-inference)")]
    del world.state["aws"]["images"]["ami-0fedcba9876543210"]
    failed = check_images(ready(world))[1]
    assert failed.status is Status.fail
    assert failed.finding.startswith("ami-0fedcba9876543210 (booted by gpu-a10g, gpu-a10g-inference) not found in "
                                     "us-west-2: An error occurred (InvalidAMIID.NotFound)")


@pytest.mark.parametrize("instance_type, kind", [("m7i.16xlarge", "standard"), ("g5.48xlarge", "g"),
                                                 ("vt1.3xlarge", "g"), ("p5.48xlarge", "p"), ("inf2.xlarge", None),
                                                 ("x2idn.16xlarge", None)])
def test_instance_families_map_to_their_quota(instance_type, kind):
    assert quota_class(instance_type) == kind


def test_quotas_sum_the_vcpus_of_the_control_plane_and_the_pools(world):
    # heron: 3 x m7i.4xlarge (16) + 3 x r7i.2xlarge (8) = 72 standard vCPUs at once, + 300 x m7i.16xlarge (64);
    # G: g5.48xlarge (192) x 2..40 and g5.12xlarge (48) x 0..80.
    assert [(f.status, f.finding) for f in check_quotas(ready(world))] == [
        (Status.passed, "Running On-Demand G and VT instances (L-DB2E81BA), vCPUs in us-west-2: quota 12000 covers "
                        "up to 11520"),
        (Status.passed, "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances (L-1216C47A), vCPUs in "
                        "us-west-2: quota 20000 covers up to 19272")]
    world.state["aws"]["quotas"] = {"L-1216C47A": 5000, "L-DB2E81BA": 64}
    g, standard = check_quotas(ready(world))
    assert (g.status, standard.status) == (Status.fail, Status.warn)
    assert g.finding.endswith("quota 64, but 384 are needed at once (up to 11520 at full scale)")
    assert g.fix == ("request more: aws service-quotas request-service-quota-increase --service-code ec2 "
                     "--quota-code L-DB2E81BA --desired-value 11520 --region us-west-2")


def test_a_machine_type_the_region_lacks_fails(world):
    del world.state["aws"]["instance_types"]["g5.48xlarge"]
    [found] = check_quotas(ready(world))
    assert found.status is Status.fail and "InvalidInstanceType" in found.finding


def test_the_cloud_extra_missing_fails_with_the_pip_extra(world, monkeypatch):
    assert check_extra(world.context("heron"))[0].status is Status.passed
    monkeypatch.setitem(sys.modules, "pulumi_aws", None)    # as if not installed
    [found] = check_extra(world.context("heron"))
    assert (found.status, found.fix) == (Status.fail, "pip install 'corral[aws]'")
