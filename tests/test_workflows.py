"""The GitHub workflows and CODEOWNERS hold the line on secrets and privilege.

Read as data (the YAML the Actions runner reads), not as text, so a check
cannot be dodged by a comment or a reformatting:
- no `--show-secrets` output goes to a file, and nothing uploads an artifact
  (stack outputs hold the admin kubeconfig and VPN keys);
- every third-party action is pinned by a full commit SHA (a tag can be moved);
- the workflow token has no permissions by default, each job names its own,
  and only jobs that log in to a cloud may mint OIDC tokens;
- jobs on self-hosted runners run in a (protected) environment;
- CODEOWNERS covers every path whose code runs with credentials;
- the PR review runs the target branch's corral with the PR's cluster and stack
  files as data, never code from the PR, and is the required check that
  .github/rulesets/main.json names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
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


# --- The PR review runs the target branch's corral on the PR's files as data -----------------------
#
# pr.yml checks the target branch out as the code (the PR's base commit) and the
# PR only as data (its clusters/ and stacks/), so a PR that edits corral/diff/
# cannot turn its own danger check green. The review job is a required status
# check, named in .github/rulesets/main.json.

PR_WORKFLOW = REPO / ".github" / "workflows" / "pr.yml"
RULESET = REPO / ".github" / "rulesets" / "main.json"
CHECKOUT = "actions/checkout"
BASE_REF = "${{ github.event.pull_request.base.sha }}"
# Commands that may name the PR's checkout: they read or copy files, they run nothing from them.
DATA_COMMANDS = {"cp", "diff", "find", "test", "["}
# Words that start a shell command list without being the command.
SHELL_KEYWORDS = {"if", "then", "elif", "else", "do", "while", "until", "!", "{", "(", "time"}
# The GitHub Actions app: a required check from any other app (or a commit status
# any writer can set) does not count (integrations/terraform-provider-github#2474:
# `gh api /apps/github-actions` gives id 15368).
GITHUB_ACTIONS_APP_ID = 15368


def review_job() -> tuple[str, dict]:
    (job_id, job), = jobs(PR_WORKFLOW).items()
    return job_id, job


def checkouts(job: dict) -> list[tuple[int, dict]]:
    return [(i, step) for i, step in enumerate(job["steps"]) if step.get("uses", "").split("@")[0] == CHECKOUT]


def code_and_data_checkouts() -> tuple[tuple[int, dict], tuple[int, dict]]:
    _, job = review_job()
    found = checkouts(job)
    code = [(i, s) for i, s in found if s.get("with", {}).get("ref") == BASE_REF]
    data = [(i, s) for i, s in found if s.get("with", {}).get("ref") != BASE_REF]
    assert len(code) == 1, f"pr.yml: one checkout of the PR's base commit ({BASE_REF}) for the code that runs, found {code}"
    assert len(data) == 1, f"pr.yml: one checkout of the PR as data, found {data}"
    return code[0], data[0]


def checkout_path(step: dict) -> str:
    path = step.get("with", {}).get("path", "")
    assert path and path not in (".", "./"), f"each checkout in its own folder, not the workspace root: {step}"
    return path.strip("/").removeprefix("./")


def simple_commands(script: str):
    """Each simple command of a shell script as its words (`;`, `&&`, `||`, `|`, keywords split)."""
    import shlex

    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        try:
            tokens = list(lexer)
        except ValueError as error:  # an unbalanced quote: make the test say where
            raise AssertionError(f"cannot read shell line {line!r}: {error}") from None
        for token in tokens + [";"]:
            if token and set(token) <= set(";&|()"):
                if words:
                    yield words
                words = []
            elif not words and token in SHELL_KEYWORDS:
                continue
            else:
                words.append(token)


def names_folder(word: str, folder: str) -> bool:
    word = word.removeprefix("./")
    return word == folder or word.startswith(folder + "/") or f"/{folder}/" in word or f"$GITHUB_WORKSPACE/{folder}" in word


def test_pr_workflow_runs_on_pull_request_only_and_on_every_pull_request():
    workflow = load(PR_WORKFLOW)
    triggers = workflow["on"]
    assert set(triggers) == {"pull_request"}, "pull_request_target would hand a fork's PR a write token and secrets"
    event = triggers["pull_request"] or {}
    # A required check of a workflow skipped by a path or branch filter stays pending forever.
    assert not {"paths", "paths-ignore", "branches", "branches-ignore"} & set(event), event
    # The allow-destructive label is read from the event: adding or removing it must run the check again.
    assert {"opened", "synchronize", "reopened", "labeled", "unlabeled"} <= set(event.get("types", [])), event


def test_pr_workflow_checks_out_the_base_commit_as_code_and_the_pr_as_data_only():
    (code_index, code), (data_index, data) = code_and_data_checkouts()
    assert checkout_path(code) != checkout_path(data)
    for step in (code, data):
        assert step["with"].get("persist-credentials") is False, f"the token stays out of .git/config: {step}"
    # The PR's checkout holds nothing but the files the review reads.
    options = data["with"]
    assert options.get("sparse-checkout-cone-mode") is False, "cone mode also checks out every top-level file"
    patterns = {p.strip() for p in str(options.get("sparse-checkout", "")).splitlines() if p.strip()}
    assert patterns == {"/clusters/", "/stacks/"}, patterns
    assert options.get("ref") in ("${{ github.sha }}", "${{ github.event.pull_request.head.sha }}"), options
    assert code_index < data_index


def test_pr_workflow_installs_the_base_checkout_before_the_pr_is_on_disk():
    (_, code), (data_index, _) = code_and_data_checkouts()
    base = checkout_path(code)
    _, job = review_job()
    installs = []
    for index, step in enumerate(job["steps"]):
        for words in simple_commands(step.get("run", "")):
            if "install" in words and any(w == "pip" or w.endswith("/pip") or w == "pip3" for w in words[:3]) \
                    or words[:4] == ["python", "-m", "pip", "install"]:
                installs.append((index, step, words))
    assert installs, "pr.yml installs corral"
    for index, step, words in installs:
        assert step.get("working-directory") is None, f"{step}: install with an explicit path from the workspace"
        targets = [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
        assert targets, words
        for target in targets:
            assert re.fullmatch(rf"\./{re.escape(base)}(\[[a-z,]+\])?", target), (
                f"pr.yml installs {target!r}: only the base checkout ./{base} may be installed")
        assert "-e" not in words and "--editable" not in words, "an editable install reads the tree as it changes"
        assert index < data_index, "corral is installed before the PR's files are checked out"


def test_pr_workflow_never_runs_anything_from_the_pr_checkout():
    (_, code), (_, data) = code_and_data_checkouts()
    head = checkout_path(data)
    workflow = load(PR_WORKFLOW)
    _, job = review_job()
    for scope in (workflow, job):
        defaults = (scope.get("defaults") or {}).get("run") or {}
        assert not names_folder(str(defaults.get("working-directory", "")), head), defaults
        for key, value in (scope.get("env") or {}).items():
            assert not names_folder(str(value), head), f"env {key}={value}: nothing of the PR on a search path"
    for step in job["steps"]:
        uses = step.get("uses", "")
        assert not names_folder(uses, head), f"{step}: an action from the PR's checkout"
        assert not names_folder(str(step.get("working-directory", "")), head), f"{step}: runs inside the PR's checkout"
        for key, value in (step.get("env") or {}).items():
            assert not names_folder(str(value), head), f"{step.get('name')}: env {key}={value}"
        script = step.get("run", "")
        # No search path or environment the later steps inherit (PATH, PYTHONPATH, ...).
        assert "GITHUB_PATH" not in script and "GITHUB_ENV" not in script and "PYTHONPATH" not in script, script
        for words in simple_commands(script):
            if any(names_folder(w, head) for w in words):
                assert words[0] in DATA_COMMANDS, (
                    f"pr.yml step {step.get('name')!r} runs `{' '.join(words)}` on the PR's checkout: "
                    f"only {sorted(DATA_COMMANDS)} may touch it")
                assert not names_folder(words[0], head), words


def test_pr_workflow_points_corral_at_the_base_tree_and_compares_with_the_base_commit():
    (_, code), _ = code_and_data_checkouts()
    base = checkout_path(code)
    _, job = review_job()
    runs = [(step, words) for step in job["steps"] for words in simple_commands(step.get("run", ""))
            if words and words[0] == "corral"]
    assert {words[1] for _, words in runs} >= {"validate", "diff"}, runs
    for step, words in runs:
        assert words[words.index("--clusters") + 1] == f"{base}/clusters", words
        if words[1] == "diff":
            assert step["env"][words[words.index("--base") + 1].strip("${}")] == BASE_REF, step
            assert "--fail-on-danger" in words


def run_data_step(workspace: Path) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """The workflow's own data step, run by bash in a fake workspace (base/ and head/ checkouts)."""
    _, job = review_job()
    (step,) = [s for s in job["steps"] if s.get("id") == "data"]
    outputs = workspace / "github_output"
    outputs.write_text("")
    done = subprocess.run(["bash", "-c", step["run"]], cwd=workspace, capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "GITHUB_OUTPUT": str(outputs)})
    values = dict(line.split("=", 1) for line in outputs.read_text().splitlines() if "=" in line)
    return done, values


def make_checkouts(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    for side in ("base", "head"):
        for folder in ("clusters", "stacks"):
            shutil.copytree(REPO / folder, workspace / side / folder)
    (workspace / "base" / "corral").mkdir()  # stands for the code, which the step leaves alone
    return workspace


def test_data_step_passes_a_pr_that_changes_no_cluster_file(tmp_path):
    workspace = make_checkouts(tmp_path)
    done, outputs = run_data_step(workspace)
    assert done.returncode == 0, done.stderr
    assert outputs == {"changed": "false"}


def test_data_step_puts_the_prs_files_into_the_base_tree(tmp_path):
    workspace = make_checkouts(tmp_path)
    heron = workspace / "head" / "clusters" / "heron.yaml"
    heron.write_text(heron.read_text().replace("maxSize: 80", "maxSize: 120", 1))
    (workspace / "head" / "clusters" / "ibis.yaml").unlink()  # a deleted cluster file is deleted in the base tree too
    done, outputs = run_data_step(workspace)
    assert done.returncode == 0, done.stderr
    assert outputs == {"changed": "true"}
    base = workspace / "base"
    assert sorted(p.name for p in (base / "clusters").iterdir()) == sorted(p.name for p in heron.parent.iterdir())
    assert (base / "clusters" / "heron.yaml").read_text() == heron.read_text()
    assert (base / "corral").is_dir()


@pytest.mark.parametrize("link", ["clusters/kite.yaml", "stacks/Pulumi.kite.yaml", "clusters"])
def test_data_step_refuses_symbolic_links_from_the_pr(tmp_path, link):
    workspace = make_checkouts(tmp_path)
    secret = tmp_path / "runner-secret"
    secret.write_text("token")
    target = workspace / "head" / link
    if target.is_dir():
        shutil.rmtree(target)
    target.symlink_to(secret)
    before = sorted(p.name for p in (workspace / "base" / "clusters").iterdir())
    done, outputs = run_data_step(workspace)
    assert done.returncode == 1, done.stdout
    assert "symbolic links or special files" in done.stdout and f"refused: head/{link}" in done.stdout
    assert "changed" not in outputs
    assert sorted(p.name for p in (workspace / "base" / "clusters").iterdir()) == before


def test_ruleset_requires_the_review_job_from_github_actions_on_the_default_branch():
    ruleset = json.loads(RULESET.read_text(encoding="utf-8"))
    _, job = review_job()
    check_name = job.get("name") or review_job()[0]  # a job's check is named by `name`, else its id
    assert "if" not in job, "a job skipped by a condition reports success: the required check must always run"
    assert ruleset["target"] == "branch" and ruleset["enforcement"] == "active", ruleset
    assert ruleset["conditions"]["ref_name"]["include"] == ["~DEFAULT_BRANCH"], ruleset["conditions"]
    assert ruleset.get("bypass_actors") == [], "nobody merges around the review"
    rules = {rule["type"]: rule.get("parameters", {}) for rule in ruleset["rules"]}
    checks = rules["required_status_checks"]["required_status_checks"]
    assert {"context": check_name, "integration_id": GITHUB_ACTIONS_APP_ID} in checks, (checks, check_name)
    # The check ran on the target branch as it is now, not as it was when the PR was opened.
    assert rules["required_status_checks"]["strict_required_status_checks_policy"] is True
    # A PR that changes corral itself is judged by the base's corral: its code owners review it.
    assert rules["pull_request"]["require_code_owner_review"] is True
    assert rules["pull_request"]["required_approving_review_count"] >= 1
    assert rules["pull_request"]["dismiss_stale_reviews_on_push"] is True


def test_review_steps_end_to_end_on_a_fake_workspace(tmp_path):
    """The data step, then the workflow's validate and diff scripts, run by bash with the installed corral.

    The base checkout is a git repository at the target commit; the PR deletes
    ibis (its etcd disks with it: dangerous) and resizes a heron pool.
    """
    workspace = make_checkouts(tmp_path)
    base = workspace / "base"
    git = ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=base, check=True)
    subprocess.run([*git, "add", "."], cwd=base, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "target branch"], cwd=base, check=True)
    base_sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=base, check=True, capture_output=True,
                              text=True).stdout.strip()
    (workspace / "head" / "clusters" / "ibis.yaml").unlink()
    heron = workspace / "head" / "clusters" / "heron.yaml"
    heron.write_text(heron.read_text().replace("maxSize: 80", "maxSize: 120", 1))
    done, outputs = run_data_step(workspace)
    assert done.returncode == 0 and outputs == {"changed": "true"}, done.stderr

    _, job = review_job()
    by_id = {step.get("id"): step for step in job["steps"]}
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "CORRAL_PLAN_CACHE": "off", "GITHUB_OUTPUT": str(workspace / "github_output"),
           "BASE_SHA": base_sha, "VALIDATE_OUTCOME": "success"}
    validate = subprocess.run(["bash", "-c", by_id["validate"]["run"]], cwd=workspace, env=env,
                              capture_output=True, text=True)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "ok base/clusters/heron.yaml" in (workspace / "validate.txt").read_text()
    diff = subprocess.run(["bash", "-c", by_id["diff"]["run"]], cwd=workspace, env=env, capture_output=True, text=True)
    assert diff.returncode == 0, diff.stderr
    assert "exit=2" in (workspace / "github_output").read_text()  # dangerous: the label step fails the job
    report = (workspace / "diff.md").read_text()
    assert "### ⛔ Dangerous changes" in report and "ibis-etcd-0-data" in report
    assert "### heron (modified" in report and "### ibis (removed" in report


def test_deploy_installs_every_cloud_to_diff_and_only_the_clusters_cloud_to_deploy():
    """Each cloud's Pulumi provider is an extra of pyproject.toml (tests/test_extras.py)."""
    deploy = jobs(REPO / ".github" / "workflows" / "deploy.yml")
    changes = [words for step in deploy["changes"]["steps"] for words in simple_commands(step.get("run", ""))]
    assert ["pip", "install", ".[all]"] in changes, changes
    installs = [(step, words) for step in deploy["deploy"]["steps"] for words in simple_commands(step.get("run", ""))
                if words[:2] == ["pip", "install"]]
    assert [words for _, words in installs] == [["pip", "install", ".[$CLOUD]"]], installs
    assert installs[0][0]["env"]["CLOUD"] == "${{ matrix.cloud }}"
