"""pulumi.cli, pulumi.login, pulumi.stack, pulumi.config: each check's pass and its failures."""

from __future__ import annotations

from corral.doctor import Finding, Status
from corral.doctor.pulumi_checks import (
    check_cli,
    check_config,
    check_login,
    check_stack,
    required_cli_version,
)


def test_a_current_cli_passes_and_names_the_floor_from_corrals_sdk_pin(world):
    ctx = world.context("heron")
    [found] = check_cli(ctx)
    floor, pin = required_cli_version()
    assert (found.status, found.finding) == (Status.passed, f"pulumi v3.272.0 (needs v{floor} or later for {pin})")
    assert pin.startswith("pulumi") and ">=3.140" in pin


def test_a_cli_older_than_the_pin_fails_with_the_installer(world):
    world.state["pulumi"]["version"] = "v3.99.1"
    [found] = check_cli(ctx := world.context("heron"))
    assert found.status is Status.fail
    assert found.finding.startswith("pulumi v3.99.1 is older than v3.140.0")
    assert found.fix.startswith("curl -fsSL https://get.pulumi.com | sh -s -- --version ")
    assert not ctx.pulumi_usable


def test_a_cli_older_than_the_installed_sdk_only_warns(world):
    world.state["pulumi"]["version"] = "v3.140.0"
    [found] = check_cli(world.context("heron"))
    assert found.status is Status.warn and "older than the installed Python SDK" in found.finding


def test_no_pulumi_on_path_fails_with_the_install_hint_and_skips_what_needs_it(world, tmp_path):
    ctx = world.context("heron", PATH=str(tmp_path))
    [cli] = check_cli(ctx)
    assert (cli.status, cli.finding) == (Status.fail, "pulumi is not installed (not on PATH)")
    assert "https://www.pulumi.com/docs/install/" in cli.fix
    assert [f.status for f in check_login(ctx) + check_stack(ctx)] == [Status.skip, Status.skip]


def test_login_shows_user_and_backend_but_never_credentials_in_its_url(world):
    world.state["pulumi"]["url"] = "postgres://deployer:hunter2@db.example.com:5432/pulumi?sslmode=verify-full"
    ctx = world.context("heron")
    check_cli(ctx)
    [found] = check_login(ctx)
    assert (found.status, found.finding) == (Status.passed,
                                             "logged in as alice at postgres://db.example.com:5432/pulumi")
    assert "hunter2" not in found.finding and "deployer" not in found.finding


def test_not_logged_in_fails_with_pulumi_login(world):
    world.state["pulumi"]["user"] = None
    ctx = world.context("heron")
    check_cli(ctx)
    [found] = check_login(ctx)
    assert found.status is Status.fail and found.finding.startswith("not logged in to a Pulumi backend: error: ")
    assert found.fix.startswith("pulumi login")
    assert check_stack(ctx) == [Finding("pulumi.stack", Status.skip, "needs a Pulumi login (see pulumi.login)")]


def test_the_stack_is_found_by_name_or_qualified_name_and_a_missing_one_says_stack_init(world):
    world.state["pulumi"]["stacks"] = [{"name": "acme/corral/heron", "resourceCount": 212, "current": False}]
    ctx = world.context("heron")
    check_cli(ctx)
    check_login(ctx)
    assert [(f.status, f.finding) for f in check_stack(ctx)] == [
        (Status.passed, "stack acme/corral/heron exists (212 resources)")]
    world.state["pulumi"]["stacks"] = [{"name": "ibis", "current": True}]
    ctx = world.context("heron")
    check_cli(ctx)
    check_login(ctx)
    [found] = check_stack(ctx)
    assert (found.status, found.finding) == (Status.fail, "no stack heron in this backend (1 other stacks)")
    assert found.fix == f"pulumi stack init heron  (in {world.project})"
    assert ["pulumi", "stack", "ls", "--json"] in world.calls()


def test_the_stack_settings_pass_when_complete(world):
    assert [(f.status, f.finding) for f in check_config(world.context("heron"))] == [
        (Status.passed, "stacks/Pulumi.heron.yaml has every setting aws needs")]


def test_missing_settings_a_placeholder_and_a_wrong_region_each_fail_naming_file_line_and_key(world):
    world.stack("ibis", "config:\n  gcp:project: REPLACE-ME\n  gcp:region: europe-west4\n")
    findings = check_config(world.context("ibis"))
    assert [(f.status, f.finding) for f in findings] == [
        (Status.fail, "stacks/Pulumi.ibis.yaml:2:3: config.gcp:project: gcp:project is still REPLACE-ME, the "
                      "scaffold's placeholder: set it (pulumi config set -s ibis gcp:project VALUE, or edit this line)"),
        (Status.fail, "stacks/Pulumi.ibis.yaml: corral:nodeImage is not set"),
        (Status.fail, "stacks/Pulumi.ibis.yaml: gcp:region is europe-west4, the cluster's region is us-central1"),
        (Status.warn, "stacks/Pulumi.ibis.yaml: corral:gpuNodeImage is not set: GPU pools boot corral:nodeImage, "
                      "which needs the NVIDIA driver then"),
    ]
    assert findings[2].fix == "pulumi config set -s ibis gcp:region us-central1"


def test_a_missing_or_broken_stack_file_fails_without_a_traceback(world):
    (world.project / "stacks" / "Pulumi.heron.yaml").unlink()
    [missing] = check_config(world.context("heron"))
    assert (missing.status, missing.finding) == (Status.fail, "stacks/Pulumi.heron.yaml does not exist")
    world.stack("heron", "config:\n  aws:region: [us-west-2\n")
    [broken] = check_config(world.context("heron"))
    assert broken.status is Status.fail and "Pulumi.heron.yaml:" in broken.finding
