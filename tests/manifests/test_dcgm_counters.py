"""dcgm-exporter's counters file: every DCGM counter corral reads is collected.

dcgm-exporter exports only the fields its counters file lists, and its
default file (github.com/NVIDIA/dcgm-exporter etc/default-counters.csv) has
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL commented out, so GPUMemoryErrors never fired.
The file here is read from the rendered ConfigMap the way dcgm-exporter reads
it (pkg/dcgmexporter/parser.go: Go's encoding/csv with `#` comments, three
fields per record, spaces trimmed, a known Prometheus type), and compared with
every DCGM name in what reads the series: the alert and recording rules on both
Prometheus tiers, the federation list, the dashboards, and `corral usage`'s
source.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from corral.health import rules as health_rules
from corral.manifests import dashboards, monitoring, render
from corral.model import load_fleet

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])
DCGM_NAME = re.compile(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+\b")
PROMETHEUS_TYPES = {"gauge", "counter", "histogram", "summary", "label"}  # dcgm-exporter's promMetricType


def counters_file(cluster) -> str:
    addon = next(a for a in render(cluster) if a.name == "monitoring")
    configmap = next(o for o in addon.objects if o["kind"] == "ConfigMap"
                     and o["metadata"]["name"] == monitoring.DCGM_COUNTERS_CONFIGMAP)
    return configmap["data"][monitoring.DCGM_COUNTERS_FILE]


def parse(text: str) -> dict[str, str]:
    """Field -> Prometheus type, as dcgm-exporter parses the file (module docstring)."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    fields: dict[str, str] = {}
    for number, record in enumerate(csv.reader(io.StringIO("\n".join(lines)))):
        if not record:
            continue
        record = [r.strip(" ") for r in record]
        assert len(record) == 3, f"record {number} {record}: dcgm-exporter expects 3 fields and exits"
        field, kind, _ = record
        assert kind in PROMETHEUS_TYPES, f"{field}: unknown Prometheus type {kind!r}"
        assert field not in fields, f"{field} listed twice"
        fields[field] = kind
    return fields


def read_by_corral(gpu_rule_groups: list[dict] | None = None) -> dict[str, set[str]]:
    """Every DCGM counter corral reads, by where it reads it."""
    groups = gpu_rule_groups if gpu_rule_groups is not None else health_rules.rule_groups()
    sources = {
        "shard recording rules": json.dumps(monitoring.shard_rule_groups(True)),
        "global rules": json.dumps(monitoring.global_rule_groups(True)),
        "GPU health rules": json.dumps(groups),
        "federation": json.dumps(monitoring.FEDERATED),
        "dashboards": json.dumps(dashboards.dashboards(True)),
        "corral usage": "\n".join(p.read_text() for p in sorted((ROOT / "corral" / "usage").rglob("*.py"))),
    }
    return {where: set(DCGM_NAME.findall(text)) for where, text in sources.items()}


def missing(collected: set[str], read: dict[str, set[str]]) -> dict[str, set[str]]:
    return {where: names - collected for where, names in read.items() if names - collected}


@pytest.mark.parametrize("name", sorted(n for n, c in FLEET.clusters.items() if any(p.gpu for p in c.node_pools)))
def test_every_dcgm_counter_corral_reads_is_in_the_counters_file(name):
    collected = set(parse(counters_file(FLEET.clusters[name])))
    read = read_by_corral()
    # The rules do read DCGM counters: the check is not vacuous.
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_GPU_UTIL"} <= set().union(*read.values())
    assert missing(collected, read) == {}


def test_a_rule_on_a_counter_the_file_lacks_is_caught():
    collected = set(parse(monitoring.dcgm_counters_csv()))
    groups = health_rules.rule_groups()
    groups[0]["rules"].append({"alert": "GPUPowerBrake", "expr": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS > 0"})
    assert missing(collected, read_by_corral(groups)) == {"GPU health rules": {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}}
    # And the upstream default file's gap, the reason for the file: without
    # DBE_VOL_TOTAL, GPUMemoryErrors reads a series nobody exports.
    assert missing(collected - {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}, read_by_corral()) == {
        where: {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"} for where in ("global rules", "GPU health rules", "federation",
                                                               "dashboards")}


def test_dcgm_exporter_reads_the_file_and_restarts_when_it_changes():
    objects = {o["metadata"]["name"]: o for a in render(FLEET.clusters["jaguar"]) if a.name == "monitoring"
               for o in a.objects if o["kind"] in ("DaemonSet", "ConfigMap")}
    pod = objects["dcgm-exporter"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    # $DCGM_EXPORTER_COLLECTORS is -f/--collectors (pkg/cmd/app.go, CLIFieldsFile).
    path = env["DCGM_EXPORTER_COLLECTORS"]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == monitoring.DCGM_COUNTERS_CONFIGMAP
    assert path.removeprefix(mount["mountPath"] + "/") in objects[monitoring.DCGM_COUNTERS_CONFIGMAP]["data"]
    # Not over the image's own /etc/dcgm-exporter, which holds its other files.
    assert not mount["mountPath"].startswith("/etc/dcgm-exporter")
    assert pod["metadata"]["annotations"]["corral.dev/config-hash"]


def test_the_sizing_covers_the_counters():
    # DCGM_SERIES_PER_GPU is what the shards are sized for.
    assert monitoring.dcgm_series_per_gpu() <= monitoring.DCGM_SERIES_PER_GPU
    kinds = parse(monitoring.dcgm_counters_csv())
    assert monitoring.dcgm_series_per_gpu() == sum(1 for k in kinds.values() if k != "label")


def test_help_texts_have_no_commas_or_quotes():
    # A comma is a fourth field and a quote a CSV error: dcgm-exporter would exit.
    for field, kind, help_text in monitoring.DCGM_COUNTERS:
        assert "," not in help_text and '"' not in help_text, field
        assert DCGM_NAME.fullmatch(field), field
