"""Fixtures of the GPU health tests: the example clusters and the rendered preflight."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

from corral.health import addon
from corral.machine import gpu_preflight as preflight
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


@pytest.fixture(scope="module")
def agent():
    """agent.py loaded the way the pod runs it: a file beside classify.py, not the package."""
    spec = importlib.util.spec_from_file_location("corral_health_agent", addon.HERE / "agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("classify", None)
