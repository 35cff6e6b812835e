"""Networks across the fleet (corral/model/fleet_rules.py, issue 26 item 3; docs/fleet.md)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.model import ValidationFailed, load_fleet
from corral.model.edit import validate_edit
from corral.model.fleet_rules import check_fleet
from tests.model.helpers import EXAMPLES, example, line_of, problems

DOCS = '(docs/fleet.md, "Networks across the fleet")'
ROUTED = ("cloud and site networks are routed between the fleet's clouds and data centres "
          "(site VPNs, peering), so each is unique in the fleet")


def fleet_with(**changes: tuple[str, str]) -> dict[str, str]:
    """The example fleet's files, with `old` replaced by `new` in the named ones."""
    files = {f"{n}.yaml": example(n) for n in ("heron", "ibis", "jaguar")}
    for name, (old, new) in changes.items():
        assert old in files[f"{name}.yaml"], (name, old)
        files[f"{name}.yaml"] = files[f"{name}.yaml"].replace(old, new, 1)
    return files


def kestrel(pod: str = "10.140.0.0/14", service: str = "10.99.0.0/16", site: str = "sf1",
            site_cidr: str = "10.50.0.0/16") -> str:
    """A second hybrid cluster like jaguar, with its own hosts and networks, VPN'd to `site`."""
    text = example("jaguar").replace("name: jaguar", "name: kestrel")
    text = text.replace("podCIDR: 10.128.0.0/14, serviceCIDR: 10.96.0.0/16", f"podCIDR: {pod}, serviceCIDR: {service}")
    text = text.replace("networkCIDR: 10.200.0.0/20", "networkCIDR: 10.210.0.0/20")
    text = text.replace("gpu-[001:064].sf1", "gpu-[101:164].sf1").replace("gpu-[065:072].sf1", "gpu-[165:172].sf1")
    text = text.replace("  - name: sf1\n    cidrs: [10.50.0.0/16]", f"  - name: {site}\n    cidrs: [{site_cidr}]")
    return text.replace("site: sf1", f"site: {site}")


def line_in(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), start=1) if needle in line)


# --- Routed networks: unique in the whole fleet ------------------------------------


def test_a_cloud_network_overlapping_another_clusters_names_both_files_and_lines(tmp_path):
    found = problems(tmp_path, fleet_with(ibis=("networkCIDR: 10.202.0.0/20", "networkCIDR: 10.201.8.0/22")))
    assert found == [
        f"ibis.yaml:{line_of('ibis', 'networkCIDR')}:3: controlPlane.networkCIDR: 10.201.8.0/22 overlaps cluster "
        f"heron's controlPlane.networkCIDR 10.201.0.0/20 ({tmp_path}/fleet/heron.yaml:{line_of('heron', 'networkCIDR')}); "
        f"{ROUTED} {DOCS}"
    ]


def test_a_cloud_network_inside_another_clusters_site_is_refused(tmp_path):
    """Reported at the later cluster by name (jaguar), naming heron's file and line."""
    found = problems(tmp_path, fleet_with(heron=("networkCIDR: 10.201.0.0/20", "networkCIDR: 10.50.16.0/20")))
    assert len(found) == 1
    assert found[0].startswith(f"jaguar.yaml:{line_of('jaguar', 'cidrs: [10.50.0.0/16]')}:13: sites[0].cidrs[0]: "
                               "10.50.0.0/16 overlaps cluster heron's controlPlane.networkCIDR 10.50.16.0/20 "
                               f"({tmp_path}/fleet/heron.yaml:{line_of('heron', 'networkCIDR')})")


def test_two_sites_of_different_names_with_one_network_are_refused(tmp_path):
    files = fleet_with()
    files["kestrel.yaml"] = kestrel(site="sf2", site_cidr="10.50.128.0/17")
    found = problems(tmp_path, files)
    assert len(found) == 1, found
    line = line_in(files["kestrel.yaml"], "cidrs: [10.50.128.0/17]")
    assert found[0].startswith(f"kestrel.yaml:{line}:13: sites[0].cidrs[0]: "
                               "10.50.128.0/17 overlaps cluster jaguar's sites[0].cidrs[0] (site sf1) 10.50.0.0/16")
    assert "sites sf2 and sf1 would be one address range in two data centres; if they are the same data centre, " \
           "give the site the same name in both files" in found[0]


# --- Clusters that share a site: nothing overlaps ------------------------------------


def test_the_same_site_in_two_clusters_is_one_data_centre(tmp_path):
    files = fleet_with()
    files["kestrel.yaml"] = kestrel()
    assert problems(tmp_path, files) == []


def test_pod_networks_of_clusters_sharing_a_site_must_not_overlap(tmp_path):
    files = fleet_with()
    files["kestrel.yaml"] = kestrel(pod="10.130.0.0/15")
    found = problems(tmp_path, files)
    assert found == [
        f"kestrel.yaml:{line_in(files['kestrel.yaml'], 'podCIDR')}:33: kubernetes.podCIDR: 10.130.0.0/15 overlaps cluster jaguar's "
        f"kubernetes.podCIDR 10.128.0.0/14 ({tmp_path}/fleet/jaguar.yaml:{line_of('jaguar', 'podCIDR')}); "
        "clusters jaguar and kestrel share site sf1, whose routers carry both clusters' networks: "
        f"nothing of one may overlap the other {DOCS}"
    ]


def test_a_service_network_over_a_site_sharing_clusters_cloud_network_is_refused(tmp_path):
    files = fleet_with()
    files["kestrel.yaml"] = kestrel(service="10.200.0.0/16")
    found = problems(tmp_path, files)
    assert len(found) == 1, found
    assert "kubernetes.serviceCIDR: 10.200.0.0/16 overlaps cluster jaguar's controlPlane.networkCIDR 10.200.0.0/20" \
        in found[0] and "share site sf1" in found[0]


# --- Clusters that share no site: pod and service networks may be reused ---------------


def test_pod_and_service_networks_may_repeat_across_clusters_that_share_no_site(tmp_path):
    files = fleet_with(ibis=("podCIDR: 10.136.0.0/14, serviceCIDR: 10.98.0.0/16",
                             "podCIDR: 10.132.0.0/14, serviceCIDR: 10.97.0.0/16"))
    assert problems(tmp_path, files) == []


def test_a_pod_network_over_an_unconnected_clusters_cloud_network_is_allowed(tmp_path):
    files = fleet_with(ibis=("podCIDR: 10.136.0.0/14", "podCIDR: 10.200.0.0/15"))
    assert problems(tmp_path, files) == []


# --- Edits are refused before they are written ------------------------------------------


def test_an_edit_that_overlaps_another_cluster_is_refused_naming_both_files(fleet_dir):
    path = fleet_dir / "ibis.yaml"
    text = path.read_text().replace("networkCIDR: 10.202.0.0/20", "networkCIDR: 10.200.0.0/22")
    with pytest.raises(ValidationFailed) as failed:
        validate_edit(path, text)
    [problem] = failed.value.problems
    assert str(problem).startswith(f"{path} (after the edit):{line_of('ibis', 'networkCIDR')}:3: "
                                   "controlPlane.networkCIDR: 10.200.0.0/22 overlaps cluster jaguar's "
                                   f"controlPlane.networkCIDR 10.200.0.0/20 ({fleet_dir}/jaguar.yaml:"
                                   f"{line_of('jaguar', 'networkCIDR')})")


def test_an_edit_that_leaves_an_existing_overlap_alone_is_not_blamed_for_it(fleet_dir):
    ibis = fleet_dir / "ibis.yaml"
    ibis.write_text(ibis.read_text().replace("networkCIDR: 10.202.0.0/20", "networkCIDR: 10.200.0.0/22"))
    heron = fleet_dir / "heron.yaml"
    validate_edit(heron, heron.read_text().replace("maxSize: 300", "maxSize: 310"))


# --- Properties -----------------------------------------------------------------------

FLEET = load_fleet([EXAMPLES]).clusters


def routed(cluster) -> list:
    return [ipaddress.ip_network(cluster.control_plane.network_cidr),
            *(ipaddress.ip_network(c) for s in cluster.sites for c in s.cidrs)]


networks = st.builds(lambda address, prefix: ipaddress.ip_network(f"{address}/{prefix}", strict=False),
                     st.integers(10 << 24, (11 << 24) - 1).map(ipaddress.IPv4Address), st.integers(16, 24))


@settings(max_examples=200, deadline=None)
@given(networks)
def test_a_cloud_network_is_refused_exactly_when_it_overlaps_a_routed_network_of_another_cluster(net):
    ibis = FLEET["ibis"].model_copy(deep=True)
    ibis.control_plane.network_cidr = str(net)
    fleet = {**FLEET, "ibis": ibis}
    reported = [f for f in check_fleet(fleet)
                if ("ibis", ("controlPlane", "networkCIDR")) in ((f.cluster, f.path), f.other)]
    expected = any(net.overlaps(other) for name, c in FLEET.items() if name != "ibis" for other in routed(c))
    assert bool(reported) == expected


@settings(max_examples=100, deadline=None)
@given(networks, st.permutations(sorted(FLEET)))
def test_the_findings_do_not_depend_on_the_order_clusters_are_read(net, order):
    heron = FLEET["heron"].model_copy(deep=True)
    heron.control_plane.network_cidr = str(net)
    fleet = {**FLEET, "heron": heron}
    shuffled = {name: fleet[name] for name in order}
    assert sorted(map(repr, check_fleet(fleet))) == sorted(map(repr, check_fleet(shuffled)))
