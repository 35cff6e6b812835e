"""A throwaway git repository holding a copy of the example fleet, committed on `main`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout


def make_repo(root: Path, commit: bool = True, branch: str = "main") -> Path:
    clusters = root / "clusters"
    clusters.mkdir(parents=True)
    for path in EXAMPLES.glob("*.yaml"):
        shutil.copy(path, clusters / path.name)
    git(root, "init", "-q", "-b", branch)
    if commit:
        git(root, "add", ".")
        git(root, "commit", "-q", "-m", "fleet")
    return clusters


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The clusters folder of a fresh repository whose `main` holds the example fleet."""
    return make_repo(tmp_path / "repo")


def edit(clusters: Path, name: str, old: str, new: str) -> None:
    path = clusters / f"{name}.yaml"
    text = path.read_text()
    assert old in text, f"{old!r} not in {name}.yaml"
    path.write_text(text.replace(old, new, 1))


@pytest.fixture(scope="session", autouse=True)
def plan_cache(tmp_path_factory):
    """Plans cached in a throwaway folder, never in the user's ~/.cache."""
    import os

    folder = tmp_path_factory.mktemp("plan-cache")
    old = os.environ.get("CORRAL_PLAN_CACHE")
    os.environ["CORRAL_PLAN_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("CORRAL_PLAN_CACHE", None)
    else:
        os.environ["CORRAL_PLAN_CACHE"] = old
