"""The GitHub workflows and CODEOWNERS hold the line on secrets and privilege.

Read as data (the YAML the Actions runner reads), not as text, so a check
cannot be dodged by a comment or a reformatting:
- no `--show-secrets` output goes to a file, and nothing uploads an artifact
  (stack outputs hold the admin kubeconfig and VPN keys);
- every third-party action is pinned by a full commit SHA (a tag can be moved);
- the workflow token has no permissions by default, each job names its own,
  and only jobs that log in to a cloud may mint OIDC tokens;
- jobs on self-hosted runners run in a (protected) environment;
- CODEOWNERS covers every path whose code runs with credentials.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
CODEOWNERS = REPO / ".github" / "CODEOWNERS"

# Actions that log in to a cloud with the job's OIDC token.
CLOUD_LOGIN_ACTIONS = {"azure/login", "aws-actions/configure-aws-credentials", "google-github-actions/auth"}
# Paths whose code or configuration runs with cloud or cluster credentials
# (plus the cluster definitions and the workflows themselves).
OWNED_PATHS = ["/clusters/", "/stacks/", "/.github/", "/corral/", "/ansible/", "/pyproject.toml",
               "/Pulumi.yaml", "/node-images/", "/scripts/", "/.ci/"]
PINNED = re.compile(r"^[^@\s]+@[0-9a-f]{40}$")


def load(path: Path) -> dict:
    return YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))


def jobs(path: Path) -> dict[str, dict]:
    return load(path)["jobs"]


def steps(path: Path):
    for name, job in jobs(path).items():
        for step in job.get("steps", []):
            yield name, step


def test_there_are_workflows_to_check():
    assert {p.name for p in WORKFLOWS} >= {"deploy.yml", "pr.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_secret_outputs_are_written_to_files_or_printed(path):
    for job, step in steps(path):
        script = step.get("run", "")
        for line in script.replace("\\\n", " ").splitlines():
            if "--show-secrets" in line:
                # Captured into a file, a pipe or the log: all readable later.
                assert not re.search(r"[>|]|\btee\b", line), f"{path.name} {job}: secrets into a file: {line}"
                assert "GITHUB_OUTPUT" not in line and "GITHUB_ENV" not in line, line
        assert "pulumi stack output" not in script or "--show-secrets" not in script, (
            f"{path.name} {job}: `pulumi stack output --show-secrets` in a workflow step; "
            "`corral join` reads the outputs it needs itself"
        )


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_nothing_is_uploaded_as_an_artifact(path):
    for job, step in steps(path):
        action = step.get("uses", "").split("@")[0]
        assert action not in ("actions/upload-artifact", "actions/download-artifact"), (
            f"{path.name} {job}: artifacts are readable by anyone who can read the repository"
        )


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_by_commit_sha_with_its_tag_noted(path):
    text = path.read_text(encoding="utf-8")
    uses = [(job, step["uses"]) for job, step in steps(path) if "uses" in step]
    uses += [(name, job["uses"]) for name, job in jobs(path).items() if "uses" in job]
    assert uses, f"{path.name}: no actions found"
    for job, ref in uses:
        if ref.startswith("./"):
            continue  # an action of this repository: reviewed like any code here
        assert PINNED.match(ref), f"{path.name} {job}: {ref} is not pinned by a 40-hex commit SHA"
        # The tag in a comment, so a reader (and Dependabot) knows the version.
        assert re.search(re.escape(ref) + r"\s+#\s*v\d", text), f"{path.name}: {ref} needs a `# vX.Y.Z` comment"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_permissions_are_empty_by_default_and_set_per_job(path):
    workflow = load(path)
    assert workflow.get("permissions") in ({}, {"contents": "read"}), (
        f"{path.name}: top-level permissions must be {{}} (or contents: read), "
        f"not {workflow.get('permissions')!r}"
    )
    for name, job in workflow["jobs"].items():
        assert "permissions" in job, f"{path.name} {name}: every job declares its permissions"
        permissions = job["permissions"] or {}
        assert permissions != "write-all" and isinstance(permissions, dict), f"{path.name} {name}"
        logs_in = any(step.get("uses", "").split("@")[0] in CLOUD_LOGIN_ACTIONS for step in job.get("steps", []))
        if permissions.get("id-token") == "write":
            assert logs_in, f"{path.name} {name}: id-token: write without a cloud login"
        if logs_in:
            assert permissions.get("id-token") == "write", f"{path.name} {name}: a cloud login needs id-token: write"
        writes = {k for k, v in permissions.items() if v == "write"} - {"id-token"}
        assert writes <= {"pull-requests"}, f"{path.name} {name}: writes {sorted(writes)}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_self_hosted_jobs_run_only_in_an_environment_from_main(path):
    workflow = load(path)
    for name, job in workflow["jobs"].items():
        runs_on = job.get("runs-on", [])
        labels = [runs_on] if isinstance(runs_on, str) else list(runs_on)
        if "self-hosted" not in labels:
            continue
        assert job.get("environment"), f"{path.name} {name}: a self-hosted job needs a protected environment"
        # Only pushes to main: never pull requests (fork code on the runner).
        triggers = workflow["on"]
        assert "pull_request" not in triggers and "pull_request_target" not in triggers, path.name
        assert triggers["push"]["branches"] == ["main"], path.name
        assert "github.ref == 'refs/heads/main'" in job.get("if", ""), f"{path.name} {name}: main only"


def test_secrets_do_not_cross_jobs():
    """Job outputs are stored in plain text by GitHub: only non-secret values."""
    for path in WORKFLOWS:
        for name, job in jobs(path).items():
            for key, value in (job.get("outputs") or {}).items():
                assert "secret" not in str(value).lower() and "token" not in key.lower(), (path.name, name, key)


def test_join_job_gets_no_artifact_and_reads_only_what_a_join_needs():
    deploy = jobs(REPO / ".github" / "workflows" / "deploy.yml")
    join = deploy["join"]
    scripts = "\n".join(step.get("run", "") for step in join["steps"])
    assert re.search(r'corral"?\s+join\s', scripts), scripts
    assert "--outputs" not in scripts  # no file of stack outputs on the runner
    assert "--token-ttl" in scripts  # a fresh token per run that expires within hours


def _owners() -> dict[str, list[str]]:
    rules = {}
    for line in CODEOWNERS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pattern, *owners = line.split()
            rules[pattern] = owners
    return rules


@pytest.mark.parametrize("path", OWNED_PATHS)
def test_codeowners_cover_code_that_runs_with_credentials(path):
    rules = _owners()
    assert rules.get(path), f"CODEOWNERS: {path} has no owner"
    # A later, broader rule would override it (last match wins): none may clear it.
    assert all(owners for owners in rules.values()), "a CODEOWNERS rule without owners un-owns its paths"
    assert (REPO / path.strip("/")).exists(), f"{path} does not exist: a stale rule"
