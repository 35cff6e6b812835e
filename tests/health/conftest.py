"""Fixtures of the GPU health tests: the example clusters and the rendered preflight."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from corral.health import preflight
from corral.model.loader import load_cluster

ROOT = Path(__file__).resolve().parents[2]
FAKE_BIN = Path(__file__).resolve().parent / "fake_bin"


def cluster(name: str):
    return load_cluster(ROOT / "clusters" / f"{name}.yaml")


def load_script(text: str) -> types.ModuleType:
    """The rendered preflight as a module (its main() does not run on import)."""
    module = types.ModuleType("gpu_preflight")
    exec(compile(text, "gpu-preflight.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def jaguar():
    return cluster("jaguar")


@pytest.fixture
def h100_expected(jaguar) -> dict:
    return preflight.expectations(jaguar, jaguar.pool("gpu-h100-sf1"))


@pytest.fixture
def script(h100_expected) -> types.ModuleType:
    return load_script(preflight.render(h100_expected))
