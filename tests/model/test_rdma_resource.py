"""A RoCE pool's RDMA resource (roce.rdmaResource) and its traffic class.

Pods open a RoCE pool's HCAs by requesting the pool's resource from the
shared RDMA device plugin, and must mark their traffic with the traffic class
of the pool's lossless class (docs/addons.md, "RDMA for pods"). The model
gives each pool a resource name of the plugin's and Kubernetes' shape, and
refuses pools behind one name whose traffic classes differ.
"""

from __future__ import annotations

import pytest

from corral.model import load_fleet
from corral.model.schema import DEFAULT_RDMA_RESOURCE, Roce

from .helpers import EXAMPLES, example, problems, variant

JAGUAR_ROCE = "roce: {interfaces: [ens1f0np0], mtu: 9000, pfcPriority: 3, dscp: 26, ecn: true}"


def test_jaguar_pools_get_the_default_resource():
    jaguar = load_fleet([EXAMPLES]).clusters["jaguar"]
    resources = {p.name: p.roce.rdma_resource for p in jaguar.onprem_pools if p.roce}
    assert resources == {"gpu-h100-sf1": "rdma/roce", "gpu-h100-robotics": "rdma/roce"}
    assert DEFAULT_RDMA_RESOURCE == "rdma/roce"


@pytest.mark.parametrize(("dscp", "ecn", "tc"), [
    (26, True, 106),   # the usual RoCE lossless class: DSCP 26 (AF31), ECT(0)
    (26, False, 104),
    (24, False, 96),
    (0, False, 0),     # NCCL's default: best effort
    (63, True, 254),
])
def test_traffic_class_is_the_tos_byte(dscp, ecn, tc):
    # DSCP in the upper six bits, ECT(0) ('10') in the ECN bits (RFC 3168 section 5).
    assert Roce(interfaces=["ens1f0np0"], dscp=dscp, ecn=ecn).traffic_class == tc


@pytest.mark.parametrize("value", [
    "roce",               # no prefix: not what the plugin advertises
    "rdma/",              # no name
    "nvidia.com/gpu",     # another plugin's resource
    "rdma/Roce",          # upper case (it names a DaemonSet)
    "rdma/ro-ce",         # the plugin takes [a-zA-Z0-9_]+ only
    "rdma/roce_",         # Kubernetes: a qualified name ends alphanumeric
    "rdma/roce\nx",
    "rdma/" + "a" * 41,   # longer than the DaemonSet name can carry
])
def test_resource_shape_is_refused(tmp_path, value):
    found = variant(tmp_path, "jaguar", "dscp: 26, ecn: true, rdmaResource: rdma/roce}",
                    f"dscp: 26, ecn: true, rdmaResource: {value!r}}}".replace("'", '"'))
    assert any("nodePools[0].roce.rdmaResource" in line for line in found), found


@pytest.mark.parametrize("value", ["rdma/roce", "rdma/roce_a", "rdma/hca_shared_devices_a", "rdma/r0"])
def test_resource_shape_is_accepted(tmp_path, value):
    assert variant(tmp_path, "jaguar", "rdmaResource: rdma/roce}", f"rdmaResource: {value}}}") == []


def test_pools_behind_one_resource_must_share_the_traffic_class(tmp_path):
    # The robotics pool (nodePools[1]) on DSCP 24 behind the same rdma/roce.
    text = example("jaguar")
    assert text.count(JAGUAR_ROCE) == 1
    found = problems(tmp_path, {"jaguar.yaml": text.replace(JAGUAR_ROCE, JAGUAR_ROCE.replace("dscp: 26", "dscp: 24"))})
    assert len(found) == 1, found
    assert "nodePools[1].roce.rdmaResource" in found[0]
    assert "gpu-h100-sf1" in found[0] and "106" in found[0] and "(96)" not in found[0] and "(98)" in found[0]


def test_ecn_alone_differs_too(tmp_path):
    found = problems(tmp_path, {"jaguar.yaml": example("jaguar").replace(
        JAGUAR_ROCE, JAGUAR_ROCE.replace("ecn: true", "ecn: false"))})
    assert len(found) == 1 and "nodePools[1].roce.rdmaResource" in found[0] and "(104)" in found[0], found


def test_pools_with_their_own_resources_may_differ(tmp_path):
    text = example("jaguar").replace(
        JAGUAR_ROCE, JAGUAR_ROCE.replace("dscp: 26, ecn: true}", "dscp: 24, ecn: false, rdmaResource: rdma/roce_b}"))
    assert problems(tmp_path, {"jaguar.yaml": text}) == []
