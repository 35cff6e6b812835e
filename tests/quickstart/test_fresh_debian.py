"""The README's Quick start, exactly as written, on a genuinely fresh Debian 12.

Each test restores a pristine bookworm root (minbase + git + python3: no pip,
no venv, no curl, PEP 668 marker in place), clones this repository into it
and runs the Quick start commands from README.md in a systemd-nspawn
container, as root and as a normal user. CI runs this tier (`.ci/run`): what
a new user sees is what CI sees.

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
PLAN_FOOTER = re.compile(r"^(\d+) resources \((aws|gcp|azure)\), from the same program "
                         r"`pulumi up -s (\w+)` runs$", re.M)
PYTEST_SUMMARY = re.compile(r"^=+ (.*) in [\d.]+s(?: \(.*\))? =+$", re.M)
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


def _assert_demo_and_tests(results: dict[str, "object"], who: str) -> None:
    demo, tests = results["bash scripts/demo"], results["bash scripts/test"]
    assert demo.returncode == 0, f"{who}: bash scripts/demo failed:\n{demo.output[-4000:]}"
    footers = {m.group(3): m.group(2) for m in PLAN_FOOTER.finditer(demo.output)}
    assert sorted(footers) == CLUSTERS, (
        f"{who}: the demo did not print every cluster's plan: {footers}\n{demo.output[-3000:]}")
    assert tests.returncode == 0, f"{who}: bash scripts/test failed:\n{tests.output[-6000:]}"
    summaries = PYTEST_SUMMARY.findall(_plain(tests.output))
    assert summaries, f"{who}: no pytest summary line:\n{tests.output[-3000:]}"
    summary = summaries[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "error" not in summary, summary


def _run_quickstart(root: FreshRoot, user: str, checkout: str) -> dict:
    results = {}
    for command in quickstart_commands():
        log = WORK / f"{root.path.name}-{user}-{command.split()[-1].replace('/', '_')}.log"
        results[command] = root.run(["bash", "-c", command], user=user, cwd=checkout,
                                    timeout=COMMAND_TIMEOUT, log=log)
    return results


def test_readme_quick_start_is_the_two_commands():
    assert quickstart_commands() == ["bash scripts/demo", "bash scripts/test"]


def test_quick_start_as_root_then_as_a_normal_user(fresh_root):
    """Root runs the two commands on the fresh machine; then a normal user does, on the
    same machine (the Debian packages root installed are there, nothing else is)."""
    fresh_root.clone(REPO, "/root/corral")
    first = _run_quickstart(fresh_root, "root", "/root/corral")
    _assert_demo_and_tests(first, "root")

    # A second run installs nothing new: no apt, no pip.
    again = fresh_root.run(["bash", "-c", "bash scripts/demo"], cwd="/root/corral",
                           timeout=COMMAND_TIMEOUT)
    assert again.returncode == 0, again.output[-3000:]
    assert "install: corral is installed in .venv (nothing new)" in again.output
    assert "apt-get install" not in again.output and "pip install" not in again.output
    # corral is usable the way the README says
    activated = fresh_root.run(["bash", "-c", ". .venv/bin/activate && corral list"],
                               cwd="/root/corral", timeout=300)
    assert activated.returncode == 0 and "heron" in activated.output, activated.output[-2000:]

    fresh_root.add_user("dev")
    fresh_root.clone(REPO, "/home/dev/corral", owner="dev")
    as_user = _run_quickstart(fresh_root, "dev", "/home/dev/corral")
    _assert_demo_and_tests(as_user, "normal user")
    # the system Python is untouched: still externally managed, no pip in it
    system_pip = fresh_root.run(["python3", "-m", "pip", "--version"], timeout=60)
    assert system_pip.returncode != 0 and "No module named pip" in system_pip.output

    _record("root", demo_first_s=round(first["bash scripts/demo"].seconds, 1),
            test_first_s=round(first["bash scripts/test"].seconds, 1),
            demo_warm_s=round(again.seconds, 1))
    _record("user", demo_first_s=round(as_user["bash scripts/demo"].seconds, 1),
            test_first_s=round(as_user["bash scripts/test"].seconds, 1))


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
