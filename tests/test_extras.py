"""Per-cloud installs: `pip install corral[aws]` (gcp, azure, all), and what a missing cloud says.

A cloud that is not installed is simulated at the process boundary: the
corral command runs in a child Python whose import system cannot find the
blocked providers (a meta-path finder in front of every other, as for a
package pip never installed). The child is the real CLI; nothing in corral
is patched.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from corral.infra.extras import CLOUD_PROVIDERS

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))

# The child: block the named top-level modules, then run the corral CLI (or a snippet).
FAKE_NOT_INSTALLED = r'''
import sys

class FakeNotInstalled:
    """A finder that reports the blocked modules as never installed."""

    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

blocked = {name for name in sys.argv.pop(1).split(",") if name}
sys.meta_path.insert(0, FakeNotInstalled(blocked))
for name in list(sys.modules):
    if name.split(".")[0] in blocked:
        del sys.modules[name]
if sys.argv[1] == "--exec":
    exec(sys.argv[2])
else:
    from corral.cli import main
    sys.argv[0] = "corral"
    main()
'''


def without(clouds: list[str], *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    blocked = ",".join(CLOUD_PROVIDERS[cloud] for cloud in clouds)
    return subprocess.run([sys.executable, "-c", FAKE_NOT_INSTALLED, blocked, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200", "CORRAL_PLAN_CACHE": "off"})


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_each_cloud_provider_is_an_extra_and_not_a_base_dependency():
    project = PYPROJECT["project"]
    base = {requirement_name(r) for r in project["dependencies"]}
    extras = {name: {requirement_name(r) for r in reqs} for name, reqs in project["optional-dependencies"].items()}
    for cloud, module in CLOUD_PROVIDERS.items():
        package = module.replace("_", "-")
        assert package not in base, f"{package} is in every install; it belongs to the {cloud} extra"
        assert extras[cloud] == {package}, extras[cloud]
    assert extras["all"] == set().union(*(extras[cloud] for cloud in CLOUD_PROVIDERS))
    # The same version ranges in `all` as in each cloud's extra.
    optional = project["optional-dependencies"]
    assert sorted(optional["all"]) == sorted(r for cloud in CLOUD_PROVIDERS for r in optional[cloud])


def test_scripts_install_every_cloud_for_the_demo_and_the_tests():
    install = (REPO / "scripts" / "install").read_text(encoding="utf-8")
    assert 'extras="[all]"' in install and 'extras="[test,all]"' in install, "scripts/install"


@pytest.mark.parametrize("command", ["plan", "up"])
def test_a_command_for_a_cloud_that_is_not_installed_names_the_extra(command):
    done = without(["azure"], command, "jaguar")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr, done.stderr
    message = " ".join(done.stderr.split())  # rich may wrap
    assert f"corral {command} jaguar needs the azure extra: pip install 'corral[azure]'" in message, done.stderr


def test_a_cluster_on_an_installed_cloud_plans_without_the_other_clouds():
    done = without(["azure", "gcp"], "plan", "heron", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert '"aws:ec2/' in done.stdout or '"aws:' in done.stdout


def test_commands_that_plan_nothing_need_no_cloud():
    done = without(list(CLOUD_PROVIDERS), "validate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ok clusters/") == 3, done.stdout
    shown = without(list(CLOUD_PROVIDERS), "show", "jaguar")
    assert shown.returncode == 0, shown.stderr


def test_the_pulumi_program_names_the_extra_too():
    """`pulumi up` runs the program itself: its error (a RunError, one message) names the extra."""
    snippet = (
        "from corral.infra import program\n"
        "try:\n"
        "    program.cloud_package('gcp')\n"
        "except program.ProgramError as err:\n"
        "    print('ProgramError:', err)\n"
    )
    done = without(["gcp"], "--exec", snippet)
    assert done.returncode == 0, done.stderr
    assert ("ProgramError: clusters on gcp need the gcp extra, and its Pulumi provider (pulumi_gcp) "
            "is not installed: pip install 'corral[gcp]'") in done.stdout, done.stdout


def test_corral_diff_reports_the_missing_extra_per_cluster(tmp_path):
    from tests.diff.conftest import edit, make_repo

    clusters = make_repo(tmp_path / "repo")
    edit(clusters, "jaguar", "maxSize: 200", "maxSize: 300")
    done = without(["azure"], "diff", "--clusters", str(clusters), cwd=clusters.parent)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    text = " ".join(done.stdout.split())
    assert "need the azure extra" in text and "pip install 'corral[azure]'" in text, done.stdout
