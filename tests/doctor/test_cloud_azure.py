"""Azure: the az login, role assignments, the marketplace image and the vCPU quotas, against the fake az."""

from __future__ import annotations

import pytest

from corral.doctor import Status
from corral.doctor.cloud_azure import (
    check_credentials,
    check_images,
    check_permissions,
    check_quotas,
)
from corral.doctor.pulumi_checks import check_config

from .conftest import SUBSCRIPTION


def ready(world):
    ctx = world.context("jaguar")
    check_config(ctx)
    check_credentials(ctx)
    return ctx


def test_credentials_name_the_subscription_and_refuse_another_than_the_stack_pins(world):
    [found] = check_credentials(world.context("jaguar"))
    assert (found.status, found.finding) == (Status.passed, f"subscription research ({SUBSCRIPTION}) as user "
                                                            "alice@example.com")
    world.state["az"]["account"]["id"] = "11111111-2222-3333-4444-555555555555"
    ctx = world.context("jaguar")
    check_config(ctx)
    [other] = check_credentials(ctx)
    assert other.status is Status.fail and other.fix == f"az account set --subscription {SUBSCRIPTION}"
    world.state["az"]["account"] = None
    [none] = check_credentials(world.context("jaguar"))
    assert none.status is Status.fail and none.fix.startswith("az login")


@pytest.mark.parametrize("roles, status", [
    (["Owner"], Status.passed),
    (["Contributor", "User Access Administrator"], Status.passed),
    (["Contributor"], Status.fail),          # cannot create the program's role assignments
    ([], Status.fail),
    (["corral-deployer (custom)"], Status.warn),
])
def test_role_assignments(world, roles, status):
    world.state["az"]["roles"] = roles
    [found] = check_permissions(ready(world))
    assert found.status is status, found
    call = next(c for c in world.calls() if c[1:4] == ["role", "assignment", "list"])
    assert call[call.index("--scope") + 1] == f"/subscriptions/{SUBSCRIPTION}"


def test_the_marketplace_image_is_shown_in_the_region(world):
    [found] = check_images(ready(world))
    assert (found.status, found.finding) == (Status.passed, "Debian:debian-12:12-gen2:latest is offered in eastus2 "
                                                            "(every machine boots it)")
    world.state["az"]["images"] = []
    assert check_images(ready(world))[0].status is Status.fail


def test_quotas_per_family_and_regional_total(world):
    found = {f.finding.split(" vCPUs")[0]: f for f in check_quotas(ready(world))}
    # 5 x D32s_v5 (160) + 0..200 x D64s_v5 (12,800) in DSv5; 5 x E16s_v5 = 80 in ESv5.
    assert found["standardDSv5Family"].finding.endswith("quota 20000 covers up to 12960")
    assert found["standardESv5Family"].status is Status.passed
    world.state["az"]["usage"]["cores"] = 100
    assert {f.finding.split(" vCPUs")[0]: f for f in check_quotas(ready(world))}["cores"].status is Status.fail
