"""Fixtures of the kube tier: one real control plane per test session (tests/kube/lab.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .lab import KubeLab, KubeUnavailable, available, bin_dir, built_version, lab_cluster_file

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.kube)


@pytest.fixture(scope="session")
def kube_bins() -> Path:
    ok, reason = available()
    if not ok:
        pytest.skip(f"kube tier unavailable: {reason}")
    try:
        return bin_dir()
    except KubeUnavailable as why:
        pytest.skip(f"kube tier unavailable: {why}")


@pytest.fixture(scope="session")
def kube_lab(kube_bins, tmp_path_factory) -> KubeLab:
    """The control plane corral renders for the lab's cluster (lab_cluster_file: an example at the
    built release), started with the real programs."""
    root = tmp_path_factory.mktemp("kube-lab")
    cluster = lab_cluster_file(root / "clusters", built_version(kube_bins))
    lab = KubeLab(root / "lab", cluster, kube_bins)
    lab.up()
    yield lab
    lab.down()
