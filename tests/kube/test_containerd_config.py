"""The containerd config corral writes, read by the real containerd (scripts/build-runtime:
containerd v2.3.6 from its Go module, the catalog's default for every supported minor).

`containerd --config F config dump` loads F the way the daemon does at start (migration to
the newest config version, strict decoding of every plugin's section) and prints what the
daemon would run with. A key containerd does not know is only a warning there ("Ignoring
unknown key in TOML"): the daemon starts and silently does without it. So the test reads the
warnings too, and checks every value corral sets in what containerd says it will use.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from corral.machine.containerd_config import CNI_BIN_DIR, CNI_CONF_DIR, NVIDIA_RUNTIME_BINARY, render_config
from corral.model import load_cluster
from corral.model.containerd import pause_image
from corral.model.versions import DEFAULT_CONTAINERD
from tests import gobuild

ROOT = Path(__file__).resolve().parents[2]
CRI_IMAGES = "io.containerd.cri.v1.images"
CRI_RUNTIME = "io.containerd.cri.v1.runtime"


@pytest.fixture(scope="module")
def containerd(tmp_path_factory) -> Path:
    ok, reason = gobuild.available("build-runtime", "CORRAL_RUNTIME_BIN")
    if not ok:
        pytest.skip(f"containerd unavailable: {reason}")
    try:
        return gobuild.runtime_bin_dir() / "containerd"
    except gobuild.GoBuildUnavailable as why:
        pytest.skip(f"containerd unavailable: {why}")


def dump(containerd: Path, config: str, tmp_path: Path) -> tuple[dict, str]:
    """What containerd makes of `config`: (the effective config, its warnings and errors)."""
    path = tmp_path / "config.toml"
    path.write_text(config)
    run = subprocess.run([str(containerd), "--config", str(path), "config", "dump"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"containerd refused the config:\n{run.stderr}\n{config}"
    complaints = "\n".join(line for line in run.stderr.splitlines()
                           if "level=error" in line or "unknown key" in line or "deprecated" in line)
    return tomllib.loads(run.stdout), complaints


def test_containerd_reports_the_catalogs_version(containerd):
    out = subprocess.run([str(containerd), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert f" v{DEFAULT_CONTAINERD} " in out


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("version", [DEFAULT_CONTAINERD, "2.2.0"], ids=["v4-layout", "v3-layout"])
def test_containerd_runs_every_setting_corral_writes(containerd, tmp_path, gpu, version):
    sandbox = "registry.k8s.io/pause:3.10.2"
    config = render_config(version, sandbox, nvidia_runtime=gpu)
    effective, complaints = dump(containerd, config, tmp_path)
    assert complaints == "", f"containerd ignores or warns about part of corral's config:\n{complaints}"
    assert effective["version"] == 4
    images = effective["plugins"][CRI_IMAGES]
    runtime = effective["plugins"][CRI_RUNTIME]
    assert images["pinned_images"]["sandbox"] == sandbox
    assert runtime["cni"]["bin_dirs"] == [CNI_BIN_DIR]
    assert runtime["cni"]["conf_dir"] == CNI_CONF_DIR
    runtimes = runtime["containerd"]["runtimes"]
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    if gpu:
        assert runtime["containerd"]["default_runtime_name"] == "nvidia"
        assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
        assert runtimes["nvidia"]["options"]["BinaryName"] == NVIDIA_RUNTIME_BINARY
        assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    else:
        assert runtime["containerd"]["default_runtime_name"] == "runc"
        assert set(runtimes) == {"runc"}
    # CDI stays on (containerd 2.x's default): the device plugin's CDI strategy needs it.
    assert runtime["enable_cdi"] is True


@pytest.mark.parametrize("name", ["heron", "ibis", "jaguar"])
def test_every_example_clusters_node_config_runs_on_its_containerd(containerd, tmp_path, name):
    cluster = load_cluster(ROOT / "clusters" / f"{name}.yaml")
    if not cluster.kubernetes.containerd.startswith(DEFAULT_CONTAINERD.split(".")[0] + "."):
        pytest.skip(f"{name} pins containerd {cluster.kubernetes.containerd}; the built one is {DEFAULT_CONTAINERD}")
    config = render_config(cluster.kubernetes.containerd, pause_image(cluster.kubernetes.version), nvidia_runtime=True)
    effective, complaints = dump(containerd, config, tmp_path)
    assert complaints == ""
    assert effective["plugins"][CRI_IMAGES]["pinned_images"]["sandbox"] == pause_image(cluster.kubernetes.version)


def test_an_edit_in_the_old_layout_is_caught(containerd, tmp_path):
    """Why the file is written whole: containerd 2.x reads a version 2 key in a version 3
    file as unknown and starts without it. The check above sees that."""
    config = render_config(DEFAULT_CONTAINERD, "registry.k8s.io/pause:3.10.2", nvidia_runtime=False)
    config = config.replace('conf_dir = "/etc/cni/net.d"', 'conf_dir = "/etc/cni/net.d"\n  sandbox_image = "x"')
    _, complaints = dump(containerd, config, tmp_path)
    assert "unknown key" in complaints and "sandbox_image" in complaints
