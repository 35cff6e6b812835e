"""The clouds' regions and their zones: what `controlPlane.region` and the zone lists may name.

A region typo (`us-eats-1`), another cloud's region (`eastus2` on GCP) or a
zone the region does not have (`us-east-1q`) passes every shape check and
fails only at `pulumi up`, after resources were created. The rules
(`rules._control_plane`, `rules._pool_zones`) and the scaffolding (`corral
cluster new`) check them against this catalog; docs/fleet.md, "Regions and
zones", has the sources. Checked 2026-11-26. Only what a source names is
listed; where the zones of a listed region could not be sourced, the region
maps to None and its zones are held only to the cloud's naming shape
(`zone_error`).

Sources:

- AWS regions: the `aws` partition of botocore's endpoints.json (botocore
  1.44.8, the package corral's environment installs: data/endpoints.json,
  partitions[0].regions). GovCloud, China and the ISO partitions are left out:
  they are separate partitions with their own accounts and endpoints, which
  corral's AWS program does not target.
  AWS zones: the zone names EC2 reports in each region, as recorded from the
  EC2 API in github.com/getmoto/moto moto/ec2/resources/instance_type_offerings/
  availability-zone/<region>.json (commit c6bd43ff, 2026-08-01), with the AZ
  IDs of the same folder's availability-zone-id files as the count. AWS maps
  zone names to physical zones per account in its oldest regions
  (docs.aws.amazon.com/global-infrastructure/latest/regions/az-ids.html,
  "Regions with independently mapped Availability Zones"): us-west-1 has two
  zones (usw1-az1, usw1-az3) that an account sees as two of us-west-1a/b/c
  (github.com/jsonmaur/aws-regions regions.json lists all three), so all
  three are accepted. No zone source was found for ap-east-2, ap-southeast-6,
  ap-southeast-7 and mx-central-1 (opened after moto's recording).
- GCP regions and zones: the zones Compute Engine offers E2 machines in (E2
  runs in every region), from github.com/skypilot-org/skypilot-catalog
  catalogs/v7/gcp/vms.csv (commit 6f65ab58, generated from the Compute Engine
  API), cross-checked with cloud.google.com/compute/docs/regions-zones
  (us-central1 has a, b, c and f; europe-west1 b, c and d). AI zones are left
  out.
- Azure regions, and which have availability zones: github.com/MicrosoftDocs/
  azure-docs articles/reliability/regions-list.md (commit 04495fc0, ms.date
  2025-03-21), the programmatic name being the display name in lower case
  without spaces as learn.microsoft.com/azure/reliability/regions-list shows
  it (australiacentral ...); Austria East and Belgium Central (three zones)
  from the current page. Regions with zones have the logical zones "1", "2"
  and "3" (learn.microsoft.com, PhysicalToLogicalZoneMapping: "e.g. "1", "2",
  "3""). Government and China clouds are left out.
"""

from __future__ import annotations

import re

from .gpu_catalog import CLOUD_NAMES, closest

CHECKED = "2026-11-26"

# --- AWS -----------------------------------------------------------------------

_AWS_ZONE_LETTERS: dict[str, str | None] = {
    "af-south-1": "abc",
    "ap-east-1": "abc",
    "ap-east-2": None,
    "ap-northeast-1": "acd",
    "ap-northeast-2": "abcd",
    "ap-northeast-3": "abc",
    "ap-south-1": "abc",
    "ap-south-2": "abc",
    "ap-southeast-1": "abc",
    "ap-southeast-2": "abc",
    "ap-southeast-3": "abc",
    "ap-southeast-4": "abc",
    "ap-southeast-5": "abc",
    "ap-southeast-6": None,
    "ap-southeast-7": None,
    "ca-central-1": "abd",
    "ca-west-1": "abc",
    "eu-central-1": "abc",
    "eu-central-2": "abc",
    "eu-north-1": "abc",
    "eu-south-1": "abc",
    "eu-south-2": "abc",
    "eu-west-1": "abc",
    "eu-west-2": "abc",
    "eu-west-3": "abc",
    "il-central-1": "abc",
    "me-central-1": "abc",
    "me-south-1": "abc",
    "mx-central-1": None,
    "sa-east-1": "abc",
    "us-east-1": "abcdef",
    "us-east-2": "abc",
    "us-west-1": "abc",
    "us-west-2": "abcd",
}

# --- GCP -----------------------------------------------------------------------

_GCP_ZONE_LETTERS: dict[str, str] = {
    "africa-south1": "abc",
    "asia-east1": "abc",
    "asia-east2": "abc",
    "asia-northeast1": "abc",
    "asia-northeast2": "abc",
    "asia-northeast3": "abc",
    "asia-south1": "abc",
    "asia-south2": "abc",
    "asia-southeast1": "abc",
    "asia-southeast2": "abc",
    "australia-southeast1": "abc",
    "australia-southeast2": "abc",
    "europe-central2": "abc",
    "europe-north1": "abc",
    "europe-north2": "abc",
    "europe-southwest1": "abc",
    "europe-west1": "bcd",
    "europe-west10": "abc",
    "europe-west12": "abc",
    "europe-west2": "abc",
    "europe-west3": "abc",
    "europe-west4": "abc",
    "europe-west6": "abc",
    "europe-west8": "abc",
    "europe-west9": "abc",
    "me-central1": "abc",
    "me-central2": "abc",
    "me-west1": "abc",
    "northamerica-northeast1": "abc",
    "northamerica-northeast2": "abc",
    "northamerica-south1": "abc",
    "southamerica-east1": "abc",
    "southamerica-west1": "abc",
    "us-central1": "abcf",
    "us-east1": "bcd",
    "us-east4": "abc",
    "us-east5": "abc",
    "us-south1": "abc",
    "us-west1": "abc",
    "us-west2": "abc",
    "us-west3": "abc",
    "us-west4": "abc",
}

# --- Azure ---------------------------------------------------------------------

AZURE_ZONES: tuple[str, ...] = ("1", "2", "3")
_AZURE_WITH_ZONES = (
    "australiaeast", "austriaeast", "belgiumcentral", "brazilsouth", "canadacentral", "centralindia",
    "centralus", "eastasia", "eastus", "eastus2", "francecentral", "germanywestcentral",
    "indonesiacentral", "israelcentral", "italynorth", "japaneast", "japanwest", "koreacentral",
    "mexicocentral", "newzealandnorth", "northeurope", "norwayeast", "polandcentral", "qatarcentral",
    "southafricanorth", "southcentralus", "southeastasia", "spaincentral", "swedencentral",
    "switzerlandnorth", "uaenorth", "uksouth", "westeurope", "westus2", "westus3",
)
# Listed without availability zones (several only for customers granted access).
_AZURE_WITHOUT_ZONES = (
    "australiacentral", "australiacentral2", "australiasoutheast", "brazilsoutheast", "canadaeast",
    "francesouth", "germanynorth", "koreasouth", "northcentralus", "norwaywest", "southafricawest",
    "southindia", "switzerlandwest", "uaecentral", "ukwest", "westcentralus", "westindia", "westus",
)

# cloud -> region -> its zones (None: not catalogued; () : the region has none).
REGIONS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "aws": {region: None if letters is None else tuple(region + letter for letter in letters)
            for region, letters in _AWS_ZONE_LETTERS.items()},
    "gcp": {region: tuple(f"{region}-{letter}" for letter in letters)
            for region, letters in _GCP_ZONE_LETTERS.items()},
    "azure": {**{region: AZURE_ZONES for region in _AZURE_WITH_ZONES},
              **{region: () for region in _AZURE_WITHOUT_ZONES}},
}


def zones_of(cloud: str, region: str) -> tuple[str, ...] | None:
    """The region's zones; None when the region is not catalogued or its zones are not."""
    return REGIONS.get(cloud, {}).get(region)


def clouds_with_region(region: str) -> list[str]:
    return [cloud for cloud, regions in REGIONS.items() if region in regions]


_ARTICLE = {"aws": "an", "azure": "an", "gcp": "a"}


def _closest_region(cloud: str, region: str) -> str | None:
    return closest(region, sorted(REGIONS[cloud]), cutoff=0.75)


def region_error(cloud: str, region: str) -> str | None:
    """Why `region` cannot hold a corral cluster on `cloud`, or None.

    Azure regions without availability zones are refused here, once: every
    corral machine on Azure is zonal (zone-redundant API load balancer,
    Premium SSD v2 and Ultra disks attach only to zonal VMs).
    """
    regions = REGIONS[cloud]
    if region in regions:
        if cloud == "azure" and regions[region] == ():
            with_zones = [r for r in REGIONS["azure"] if REGIONS["azure"][r]]
            near = closest(region, with_zones, cutoff=0.6)
            hint = f" (like {near})" if near else ""
            return (f"Azure region {region} has no availability zones, and corral places every Azure machine in one; "
                    f"use a region with zones{hint}")
        return None
    elsewhere = clouds_with_region(region)
    if elsewhere:
        other = elsewhere[0]
        guess = _closest_region(cloud, region)
        hint = f"; did you mean {guess}?" if guess else ""
        return f"{region} is {_ARTICLE[other]} {CLOUD_NAMES[other]} region; this cluster's cloud is {cloud}{hint}"
    guess = _closest_region(cloud, region)
    hint = f"; did you mean {guess}?" if guess else ""
    return (f"unknown {CLOUD_NAMES[cloud]} region '{region}'{hint} (the {len(regions)} {CLOUD_NAMES[cloud]} regions "
            "corral knows: docs/fleet.md, \"Regions and zones\")")


# A zone's shape per cloud, for regions whose zones are not catalogued.
_ZONE_SHAPES = {
    "aws": (lambda region: re.escape(region) + r"[a-z]", "{region}a"),
    "gcp": (lambda region: re.escape(region) + r"-[a-z]", "{region}-a"),
}


def zone_error(cloud: str, region: str, zone: str) -> str | None:
    """Why `zone` is not a zone of `region` (a catalogued region of `cloud`), or None."""
    zones = zones_of(cloud, region)
    if zones is None:
        pattern, example = _ZONE_SHAPES[cloud]
        if re.fullmatch(pattern(region), zone):
            return None
        return (f"{CLOUD_NAMES[cloud]} zone '{zone}' must be in region {region}, "
                f"like {example.format(region=region)}")
    if zone in zones:
        return None
    owners = [r for r, listed in REGIONS[cloud].items() if listed and zone in listed and r != region]
    where = f" (it is a zone of {owners[0]})" if owners and cloud != "azure" else ""
    return f"'{zone}' is not a zone of {region}{where}; its zones are {', '.join(zones)}"
