"""The README's Quick start, exactly as written, on a genuinely fresh Debian 12.

Each test restores a pristine bookworm root (minbase + git + python3: no pip,
no venv, no curl, PEP 668 marker in place), clones this repository into it
and runs the Quick start commands from README.md in a systemd-nspawn
container:
- as root: the demo (apt as root), its second run (nothing new), and the
  test command's install step (apt as root) with every test collected;
- as a normal user with password-less sudo: the demo and the README's test
  command (apt through sudo), every tier: this is the suite's unit tier
  (scripts/tiers.py runs only the root-only unit tests outside);
- as a normal user without sudo on a bare machine: told what to install.
The test command as root is CI's own run of it (`.ci/run`, a fresh checkout).
What a new user sees is what CI sees.

The commands are read from the README itself, so a README edit that breaks
the Quick start fails here. The clone takes the committed HEAD.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from tests.quickstart.freshroot import WORK, FreshRoot, available

pytestmark = pytest.mark.quickstart

REPO = Path(__file__).resolve().parents[2]
CLUSTERS = sorted(p.stem for p in (REPO / "clusters").glob("*.yaml"))
# `corral plan`'s summary line, "heron (aws): 222 resources" (the run's terminal may add colour)
PLAN_SUMMARY = re.compile(r"^(\w+) \((aws|gcp|azure)\): (\d+) resources$", re.M)
ANSI_STYLE = re.compile(r"\x1b\[[0-9;]*m")
# scripts/tiers.py's closing line, summed over the tiers
TIERS_CLOSING = re.compile(r"^tests: (\d+) passed, (\d+) failed, (\d+) skipped$", re.M)
#: per command; a first run here takes about 3 minutes each
COMMAND_TIMEOUT = 45 * 60


def _plain(text: str) -> str:
    """Output without terminal colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def quickstart_commands() -> list[str]:
    """The shell commands of the README's Quick start block, comments removed."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README's Quick start has no ```sh block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return [c for c in commands if c]


@pytest.fixture(scope="module")
def fresh_machine_ok():
    ok, reason = available()
    if not ok:
        pytest.skip(reason)


@pytest.fixture
def fresh_root(fresh_machine_ok, request):
    root = FreshRoot.create(f"root-{request.node.name}")
    yield root
    if os.environ.get("CORRAL_QUICKSTART_KEEP") != "1":
        root.remove()


def _record(name: str, **figures) -> None:
    """Timings for the closing note / README, next to the run's logs."""
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / "timings.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=1) + "\n")


def _assert_demo(demo, who: str) -> None:
    assert demo.returncode == 0, f"{who}: bash scripts/demo failed:\n{demo.output[-4000:]}"
    footers = {m.group(1): m.group(2) for m in PLAN_SUMMARY.finditer(ANSI_STYLE.sub("", demo.output))}
    assert sorted(footers) == CLUSTERS, (
        f"{who}: the demo did not print every cluster's plan: {footers}\n{demo.output[-3000:]}")


def _assert_suite_passed(tests, who: str) -> tuple[int, int, int]:
    """The README's test command ran every tier and its closing line counts no failure:
    (passed, failed, skipped)."""
    assert tests.returncode == 0, f"{who}: bash scripts/test failed:\n{tests.output[-6000:]}"
    closing = TIERS_CLOSING.findall(_plain(tests.output))
    assert closing, f"{who}: no closing line from scripts/tiers.py:\n{tests.output[-3000:]}"
    passed, failed, skipped = (int(n) for n in closing[-1])
    assert passed > 0 and failed == 0, closing[-1]
    return passed, failed, skipped


def _run(root: FreshRoot, command: str, user: str, checkout: str, what: str | None = None):
    """`command` as `user` in `checkout`; its output also goes to a log named after `what`
    (default: the command's last word, e.g. scripts_demo)."""
    log = WORK / f"{root.path.name}-{user}-{(what or command.split()[-1]).replace('/', '_')}.log"
    return root.run(["bash", "-c", command], user=user, cwd=checkout, timeout=COMMAND_TIMEOUT, log=log)


def test_readme_quick_start_is_the_two_commands():
    assert quickstart_commands() == ["bash scripts/demo", "bash scripts/test"]


def test_quick_start_as_root(fresh_root):
    """Root on a fresh machine: the demo installs what it needs (apt as root, pip into .venv)
    and plans every cluster; a second run installs nothing; corral is on PATH as the README
    says; the test command's install step installs the test tools. The suite itself runs
    once, as a normal user (the next test), and its root-only tests in CI's own run."""
    demo_command, _ = quickstart_commands()
    fresh_root.clone(REPO, "/root/corral")
    demo = _run(fresh_root, demo_command, "root", "/root/corral")
    _assert_demo(demo, "root")
    assert "apt-get install python3-venv" in demo.output, "the demo installed nothing from apt as root"

    # A second run installs nothing new: no apt, no pip.
    again = fresh_root.run(["bash", "-c", demo_command], cwd="/root/corral", timeout=COMMAND_TIMEOUT)
    assert again.returncode == 0, again.output[-3000:]
    assert "install: corral is installed in .venv (nothing new)" in again.output
    assert "apt-get install" not in again.output and "pip install" not in again.output
    # corral is usable the way the README says
    activated = fresh_root.run(["bash", "-c", ". .venv/bin/activate && corral list"],
                               cwd="/root/corral", timeout=300)
    assert activated.returncode == 0 and "heron" in activated.output, activated.output[-2000:]

    # The test command's install step as root (what `bash scripts/test` runs first): the
    # test tools from apt as root, the test extra into .venv, a pytest that collects.
    installed = _run(fresh_root, "bash scripts/install --test && .venv/bin/python -m pytest --collect-only -q",
                     "root", "/root/corral", what="test-install")
    assert installed.returncode == 0, installed.output[-4000:]
    assert "apt-get install" in installed.output, "root's test install found nothing to install"
    count = re.search(r"^(\d+) tests collected", _plain(installed.output), re.M)
    assert count and int(count.group(1)) > 1000, installed.output[-2000:]

    _record("root", demo_first_s=round(demo.seconds, 1), demo_warm_s=round(again.seconds, 1),
            test_install_s=round(installed.seconds, 1))


def test_quick_start_as_a_normal_user_with_sudo_runs_the_whole_suite(fresh_root):
    """A normal user with password-less sudo on a fresh machine: the demo, then the README's test
    command, which installs the Debian packages through sudo and runs every tier."""
    demo_command, test_command = quickstart_commands()
    fresh_root.add_user("dev")
    fresh_root.grant_passwordless_sudo("dev")
    fresh_root.clone(REPO, "/home/dev/corral", owner="dev")
    demo = _run(fresh_root, demo_command, "dev", "/home/dev/corral")
    _assert_demo(demo, "normal user")
    assert "apt-get install python3-venv" in demo.output, "the demo did not install through sudo"
    tests = _run(fresh_root, test_command, "dev", "/home/dev/corral")
    passed, failed, skipped = _assert_suite_passed(tests, "normal user")
    # the system Python is untouched: still externally managed, no pip in it
    system_pip = fresh_root.run(["python3", "-m", "pip", "--version"], timeout=60)
    assert system_pip.returncode != 0 and "No module named pip" in system_pip.output

    # scripts/tiers.py counts this run's tests in the outer run's total
    _record("user", demo_first_s=round(demo.seconds, 1), test_first_s=round(tests.seconds, 1),
            passed=passed, failed=failed, skipped=skipped)


def test_normal_user_on_a_bare_machine_is_told_what_to_install(fresh_root):
    """No root, no sudo, no python3-venv: the script stops at once and names the
    Debian packages and the command an administrator runs."""
    fresh_root.add_user("dev")
    fresh_root.clone(REPO, "/home/dev/corral", owner="dev")
    for command in quickstart_commands():
        res = fresh_root.run(["bash", "-c", command], user="dev", cwd="/home/dev/corral",
                             timeout=300)
        assert res.returncode == 1, (command, res.output[-2000:])
        assert "Traceback" not in res.output
        wanted = "python3-venv" + (" git curl packer" if command.endswith("test") else "")
        wanted = [p for p in wanted.split() if p != "git"]  # git is there: it cloned
        advice = next(line for line in res.output.splitlines() if "apt-get install" in line)
        assert all(p in shlex.split(advice) for p in wanted), advice
        assert not (fresh_root.path / "home/dev/corral/.venv").exists()
