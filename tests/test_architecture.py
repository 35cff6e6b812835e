"""The layers of docs/architecture.md hold: import-linter's contracts in pyproject.toml.

The contracts run over the real package, and over a copy of it with one
import that runs back up, which they must refuse (a contract that cannot
fail proves nothing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (the test extra)")


def lint_imports(source_root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")], cwd=source_root,
                          env=env, capture_output=True, text=True, timeout=300)


def test_every_layer_imports_only_from_below_and_nothing_is_circular():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in result.stdout


@pytest.mark.parametrize("module, upward, contract", [
    # the machine layer reaching up into the clouds (what etcd/machine.py did)
    ("machine/etcd_snapshot.py", "corral.infra.platform", "corral's layers"),
    # etcd's lifecycle reaching into infra, while infra imports etcd: a circle
    ("etcd/restore.py", "corral.infra.bootstrap", "no import cycle"),
])
def test_an_import_that_runs_back_up_is_refused(tmp_path, module, upward, contract):
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "corral", copy / "corral", ignore=shutil.ignore_patterns("templates", "__pycache__"))
    if contract == "no import cycle":
        # infra -> etcd as well, so the two packages import each other
        with (copy / "corral/infra/bootstrap.py").open("a") as f:
            f.write("\nimport corral.etcd.restore  # noqa: E402,F401\n")
    with (copy / "corral" / module).open("a") as f:
        f.write(f"\nimport {upward}  # noqa: E402,F401\n")
    result = lint_imports(copy)
    assert result.returncode != 0, result.stdout[-3000:]
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout[-3000:]
