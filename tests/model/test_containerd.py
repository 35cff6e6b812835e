"""Rule: kubernetes.containerd must be one containerd supports for kubernetes.version.

containerd's RELEASES.md lists, per Kubernetes minor, the lowest release of
each containerd line it supports (corral/model/versions.py). Debian 12's own
containerd (1.6.20) is below every row from Kubernetes 1.29 on, hence Docker's
containerd.io at a pinned version.
"""

from __future__ import annotations

import pytest

from corral.model import load_cluster, load_fleet
from corral.model.containerd import (
    CONTAINERD_PACKAGES,
    DEFAULT_CONTAINERD,
    KUBERNETES_CONTAINERD,
    containerd_error,
    default_containerd,
    package_version,
)

from .helpers import EXAMPLES, line_of, variant

JAGUAR_K8S = 'version: "1.36.4",'
# The rules of an older row, on jaguar moved back to 1.31 (loading does not judge end of life;
# `corral validate` does, corral/model/support.py).
OLD_K8S = 'version: "1.31.4",'


def pin(version: str, kubernetes: str = OLD_K8S) -> str:
    return f'{kubernetes} containerd: "{version}",'


def test_debian_12_containerd_is_refused_for_kubernetes_1_31(tmp_path):
    found = variant(tmp_path, "jaguar", JAGUAR_K8S, pin("1.6.20"))
    assert found == [
        f"jaguar.yaml:{line_of('jaguar', JAGUAR_K8S)}:33: kubernetes.containerd: containerd 1.6.20 is below "
        "1.6.34, the minimum of the 1.6 line for Kubernetes 1.31 (containerd supports 2.1.0+, 2.0.0+, "
        '1.7.20+, 1.6.34+); use "1.7.27"'
    ]


@pytest.mark.parametrize("kubernetes, containerd, message", [
    ("1.30.8", "1.6.27", 'below 1.6.28, the minimum of the 1.6 line for Kubernetes 1.30'),
    ("1.31.4", "1.7.19", 'below 1.7.20, the minimum of the 1.7 line for Kubernetes 1.31'),
    ("1.32.0", "1.7.23", 'below 1.7.24, the minimum of the 1.7 line for Kubernetes 1.32'),
    ("1.31.4", "1.5.18", "is of the 1.5 line, which containerd does not support there"),
    ("1.36.0", "1.7.27", "is of the 1.7 line, which containerd does not support there"),
])
def test_below_the_minimum(kubernetes, containerd, message):
    assert message in containerd_error(kubernetes, containerd)


def test_the_old_default_is_too_old_for_kubernetes_1_34_which_moves_to_containerd_2():
    # 1.34 wants 1.7.28+, which Docker never built: corral takes 2.3 there (versions.py says why).
    assert containerd_error("1.34.1", default_containerd("1.33.1")) == (
        "containerd 1.7.27 is below 1.7.28, the minimum of the 1.7 line for Kubernetes 1.34 "
        '(containerd supports 2.1.3+, 2.0.6+, 1.7.28+, 1.6.39+; corral also takes 2.3.0+); use "2.3.6"'
    )
    assert default_containerd("1.34.12") == "2.3.6" and containerd_error("1.34.12", "2.3.6") is None


def test_a_kubernetes_minor_without_a_row():
    assert containerd_error("1.40.0", DEFAULT_CONTAINERD) == (
        "corral knows containerd's support for Kubernetes 1.26 to 1.37, not 1.40; add its row from "
        "containerd's RELEASES.md to corral/model/versions.py"
    )


def test_a_supported_version_docker_does_not_package(tmp_path):
    found = variant(tmp_path, "jaguar", JAGUAR_K8S, pin("2.1.0"))
    assert len(found) == 1 and "kubernetes.containerd: containerd 2.1.0 is not a containerd.io package" in found[0]


def test_versions_that_pass(tmp_path):
    assert containerd_error("1.30.8", "1.6.28") is None  # the 1.6 line's minimum, packaged as 1.6.28-2
    assert containerd_error("1.33.1", "1.7.24") is None
    assert variant(tmp_path, "jaguar", JAGUAR_K8S, pin("1.7.20")) == []


def test_shape(tmp_path):
    (found,) = variant(tmp_path, "jaguar", JAGUAR_K8S, f'{JAGUAR_K8S} containerd: "1.7",')
    assert 'kubernetes.containerd: \'1.7\' must be a full containerd version like "1.7.27" (quoted)' in found


def test_default_and_its_package(tmp_path):
    for name, cluster in load_fleet([EXAMPLES]).clusters.items():
        # The examples run 1.35 and 1.36, whose default is 2.3.6 (1.7.27 was the old rows').
        assert cluster.kubernetes.containerd == default_containerd(cluster.kubernetes.version) == "2.3.6", name
        assert cluster.kubernetes.containerd_package_version == "2.3.6-1~debian.12~bookworm"
    assert default_containerd("1.31.4") == "1.7.27"
    assert DEFAULT_CONTAINERD == default_containerd("1.37.2") == "2.3.6"
    assert package_version("1.6.28") == "1.6.28-2"
    (tmp_path / "jaguar.yaml").write_text((EXAMPLES / "jaguar.yaml").read_text().replace(JAGUAR_K8S, pin("1.7.24")))
    assert load_cluster(tmp_path / "jaguar.yaml").kubernetes.containerd_package_version == "1.7.24-1"


def test_tables_are_consistent():
    key = lambda v: tuple(int(p) for p in v.split("."))  # noqa: E731
    minors = sorted(KUBERNETES_CONTAINERD, key=key)
    assert minors == [f"1.{m}" for m in range(26, 38)]
    for minimums in KUBERNETES_CONTAINERD.values():
        for line, floor in minimums.items():
            assert floor.startswith(line + ".")
    for version, package in CONTAINERD_PACKAGES.items():
        assert package.startswith(version + "-")
    # 1.7.27, the old rows' default, is supported to Kubernetes 1.33 (1.7.24+); 2.3.6 from 1.34
    # (containerd lists 2.3 from 1.36; corral takes it on 1.34 and 1.35 too, versions.py says why).
    assert [m for m in minors if containerd_error(m + ".0", "1.7.27") is None] == [
        "1.26", "1.27", "1.28", "1.29", "1.30", "1.31", "1.32", "1.33"]
    assert [m for m in minors if containerd_error(m + ".0", DEFAULT_CONTAINERD) is None] == [
        "1.34", "1.35", "1.36", "1.37"]


def test_pause_image_follows_kubeadm_of_the_minor():
    from corral.model.containerd import pause_image

    # kubeadm's PauseVersion: 3.9 for 1.29 and 1.30, 3.10 for 1.31 and 1.32.
    assert pause_image("1.30.8") == "registry.k8s.io/pause:3.9"
    assert pause_image("v1.31.4") == "registry.k8s.io/pause:3.10"
    assert pause_image("1.40.0") is None


def test_a_minor_without_a_known_pause_image_is_refused(tmp_path):
    from corral.model.containerd import pause_error

    assert pause_error("1.31.4") is None
    assert "not 1.40" in pause_error("1.40.0") and "PAUSE_VERSIONS" in pause_error("1.40.0")
