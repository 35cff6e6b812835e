"""Regions and zones against the clouds' catalog (corral/model/regions.py, issue 26 item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import botocore
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.model.regions import REGIONS, region_error, zone_error, zones_of
from corral.model.rules import check_cluster
from tests.model.helpers import example, line_of, problems, variant


def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


# --- The cases ----------------------------------------------------------


def test_a_misspelt_region_is_one_finding_with_a_did_you_mean(tmp_path):
    """`region: us-eats-1` gave nine findings, each telling the user to change zones that were right."""
    found = variant(tmp_path, "heron", "  region: us-west-2\n", "  region: us-eats-1\n")
    line = line_of("heron", "region: us-west-2")
    assert found == [
        f"heron.yaml:{line}:3: controlPlane.region: unknown AWS region 'us-eats-1'; did you mean us-east-1? "
        "(the 34 AWS regions corral knows: docs/fleet.md, \"Regions and zones\")"
    ]


def test_another_clouds_region_names_its_cloud(tmp_path):
    found = only(variant(tmp_path, "ibis", "  region: us-central1\n", "  region: eastus2\n"))
    assert f"ibis.yaml:{line_of('ibis', 'region: us-central1')}:3: controlPlane.region: " in found
    assert found.endswith("eastus2 is an Azure region; this cluster's cloud is gcp")


def test_a_region_that_does_not_exist_is_refused(tmp_path):
    found = only(variant(tmp_path, "heron", "  region: us-west-2\n", "  region: us-east-9\n"))
    assert "controlPlane.region: unknown AWS region 'us-east-9'; did you mean" in found


def test_a_zone_the_region_does_not_have_is_refused_with_its_zones(tmp_path):
    text = example("heron").replace("us-west-2", "us-east-1").replace("[us-east-1a, us-east-1b, us-east-1c]",
                                                                       "[us-east-1a, us-east-1b, us-east-1q]")
    found = only(problems(tmp_path, {"heron.yaml": text}))
    line = line_of("heron", "zones: [us-west-2a, us-west-2b, us-west-2c]")
    assert found == (
        f"heron.yaml:{line}:35: controlPlane.zones[2]: 'us-east-1q' is not a zone of us-east-1; "
        "its zones are us-east-1a, us-east-1b, us-east-1c, us-east-1d, us-east-1e, us-east-1f"
    )


def test_inherited_zones_are_reported_where_they_are_written(tmp_path):
    """cpu-m7i writes no zones: its (wrong) zones are the control plane's, reported once, at that line."""
    found = only(variant(tmp_path, "heron", "zones: [us-west-2a, us-west-2b, us-west-2c]",
                         "zones: [us-west-2a, us-west-2b, us-west-2e]"))
    line = line_of("heron", "zones: [us-west-2a, us-west-2b, us-west-2c]")
    assert found.startswith(f"heron.yaml:{line}:35: controlPlane.zones[2]: 'us-west-2e' is not a zone of us-west-2")


def test_a_pools_own_zones_are_reported_at_the_pools_line(tmp_path):
    found = only(variant(tmp_path, "heron", "zones: [us-west-2a, us-west-2b]\n", "zones: [us-west-2a, us-west-2x]\n"))
    line = line_of("heron", "    zones: [us-west-2a, us-west-2b]")
    assert found.startswith(f"heron.yaml:{line}:25: nodePools[1].zones[1]: 'us-west-2x' is not a zone of us-west-2")


def test_a_zone_of_a_region_with_letters_missing(tmp_path):
    """GCP's us-east1 has no zone a (b, c, d), europe-west1 neither: a shape check let them through."""
    text = example("ibis").replace("us-central1", "us-east1")
    found = problems(tmp_path, {"ibis.yaml": text})
    assert found and all("is not a zone of us-east1 (" not in f for f in found)
    assert any("'us-east1-a' is not a zone of us-east1; its zones are us-east1-b, us-east1-c, us-east1-d" in f
               for f in found)


def test_a_zone_of_another_region_names_it():
    assert zone_error("aws", "us-west-2", "us-east-1a") == (
        "'us-east-1a' is not a zone of us-west-2 (it is a zone of us-east-1); "
        "its zones are us-west-2a, us-west-2b, us-west-2c, us-west-2d"
    )


def test_azure_region_without_zones_is_refused_once(tmp_path):
    found = only(variant(tmp_path, "jaguar", "  region: eastus2\n", "  region: westus\n"))
    assert "controlPlane.region: Azure region westus has no availability zones" in found
    assert "use a region with zones (like westus3)" in found


def test_azure_zone_four_is_refused():
    assert zone_error("azure", "eastus2", "4") == "'4' is not a zone of eastus2; its zones are 1, 2, 3"


def test_the_example_fleet_regions_are_catalogued():
    for cloud, region in (("aws", "us-west-2"), ("gcp", "us-central1"), ("azure", "eastus2")):
        assert region_error(cloud, region) is None
    assert zones_of("gcp", "us-central1") == ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")


def test_check_cluster_without_the_file_data_still_reports_a_zone_once():
    """tests/infra and others call check_cluster(cluster) alone: an inherited list counts as the control plane's."""
    from corral.model import load_cluster

    cluster = load_cluster(Path(__file__).resolve().parents[2] / "clusters" / "heron.yaml")
    cluster.control_plane.zones[2] = "us-west-2e"
    for pool in cluster.cloud_pools:
        if pool.name == "cpu-m7i":
            pool.zones = list(cluster.control_plane.zones)
    found = [f for f in check_cluster(cluster) if "us-west-2e" in f[1]]
    assert [path for path, _ in found] == [("controlPlane", "zones", 2)]


# --- The catalog against its sources -------------------------------------------


def test_aws_regions_are_botocores_aws_partition():
    """The installed botocore's endpoints.json is the source of the AWS region list."""
    endpoints = json.loads((Path(botocore.__file__).parent / "data" / "endpoints.json").read_text())
    partition = next(p for p in endpoints["partitions"] if p["partition"] == "aws")
    assert set(REGIONS["aws"]) == set(partition["regions"])


def test_every_catalogued_zone_belongs_to_its_region():
    for cloud, regions in REGIONS.items():
        for region, zones in regions.items():
            for zone in zones or ():
                assert cloud == "azure" or zone.startswith(region), (cloud, region, zone)
                assert zone_error(cloud, region, zone) is None


# --- Properties ------------------------------------------------------------------

CLOUDS = sorted(REGIONS)
catalogued = st.sampled_from([(c, r) for c in CLOUDS for r in REGIONS[c]])


@settings(max_examples=300, deadline=None)
@given(catalogued, st.data())
def test_a_region_with_one_letter_changed_is_refused_and_the_original_suggested(place, data):
    cloud, region = place
    i = data.draw(st.integers(0, len(region) - 1))
    letter = data.draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz"))
    typo = region[:i] + letter + region[i + 1:]
    message = region_error(cloud, typo)
    if typo in REGIONS[cloud]:
        return  # another real region (us-east-1 -> us-east-2)
    assert message is not None
    assert typo in message


@settings(max_examples=200, deadline=None)
@given(catalogued, st.sampled_from("abcdefghijklmnopqrstuvwxyz"))
def test_a_zone_is_accepted_exactly_when_catalogued(place, letter):
    cloud, region = place
    zones = zones_of(cloud, region)
    zone = f"{region}-{letter}" if cloud == "gcp" else f"{region}{letter}"
    if cloud == "azure":
        zone = str("abcdefghijklmnopqrstuvwxyz".index(letter))
    accepted = zone_error(cloud, region, zone) is None
    if zones is None:
        assert accepted  # uncatalogued zones: the shape is all corral can hold them to
    else:
        assert accepted == (zone in zones)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_region_of_another_cloud_is_named_as_such(cloud):
    for other in CLOUDS:
        if other == cloud:
            continue
        for region in REGIONS[other]:
            if region in REGIONS[cloud]:
                continue
            assert f"region; this cluster's cloud is {cloud}" in region_error(cloud, region)
