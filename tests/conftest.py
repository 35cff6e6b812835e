"""Shared fixtures: the example fleet and throwaway copies of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["tests.hostlab.conftest_plugin", "tests.leaks"]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "clusters"


@pytest.fixture
def fleet_dir(tmp_path: Path) -> Path:
    """A writable copy of the example fleet (clusters/*.yaml)."""
    target = tmp_path / "clusters"
    target.mkdir()
    for path in EXAMPLES.glob("*.yaml"):
        shutil.copy(path, target / path.name)
    return target
