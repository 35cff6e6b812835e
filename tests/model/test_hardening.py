"""Hostile input: strict shapes for free text, private networks, size and depth limits.

Every value of a cluster file may end up in a shell script, a systemd unit,
an Ansible variable or a cloud API, so each free-text field has a shape
without line breaks, quotes, '{{' or shell metacharacters; a file too large
or too deeply nested is refused before any YAML parser builds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.model import ValidationFailed
from corral.model.document import MAX_DEPTH, MAX_FILE_BYTES, Document
from corral.model.loader import parse_document

from .helpers import example, problems, variant


def only(found: list[str]) -> str:
    assert len(found) == 1, found
    return found[0]


HERON_DESCRIPTION = "description: Batch and inference cluster in AWS Oregon; CPU and A10G pools scale to zero"

# (example, text in the file, its hostile replacement, the field path reported)
HOSTILE = [
    ("jaguar", "aptMirror: http://mirror.sf1.internal",
     "aptMirror: \"http://mirror.sf1.internal/{{ lookup('pipe', 'id') }}\"", "sites[0].aptMirror"),
    ("jaguar", "aptMirror: http://mirror.sf1.internal",
     "aptMirror: \"http://mirror.sf1.internal\\nAcquire::http::Proxy \\\"http://evil\\\";\"", "sites[0].aptMirror"),
    ("jaguar", "aptMirror: http://mirror.sf1.internal",
     "aptMirror: \"http://mirror.sf1.internal\\n\"", "sites[0].aptMirror"),
    ("jaguar", "aptMirror: http://mirror.sf1.internal",
     "httpProxy: \"http://proxy:3128\\nExecStartPre=/bin/sh -c id\"", "sites[0].httpProxy"),
    ("jaguar", "aptMirror: http://mirror.sf1.internal",
     "httpProxy: \"http://user:secret@proxy:3128\"", "sites[0].httpProxy"),
    ("jaguar", "aptMirror: http://mirror.sf1.internal",
     "httpProxy: \"http://proxy:3128/$(reboot)\"", "sites[0].httpProxy"),
    ("jaguar", "interfaces: [ens1f0np0]", "interfaces: [\"ens1f0np0\\nreboot\"]", "nodePools[0].roce.interfaces[0]"),
    ("jaguar", "interfaces: [ens1f0np0]", "interfaces: [\"ens1f0;reboot\"]", "nodePools[0].roce.interfaces[0]"),
    ("jaguar", "interfaces: [ens1f0np0]", "interfaces: [\"ens1f0np0ens1f0np0\"]", "nodePools[0].roce.interfaces[0]"),
    ("jaguar", "interfaces: [ens1f0np0]", "interfaces: [\"../../x\"]", "nodePools[0].roce.interfaces[0]"),
    ("jaguar", "name: jaguar\n", "name: \"jaguar\\n\"\n", "name"),
    ("jaguar", "- name: gpu-h100-sf1", "- name: \"gpu-h100-sf1\\n\"", "nodePools[0].name"),
    ("jaguar", "corral.dev/fabric: sf1-roce", "corral.dev/fabric: \"sf1-roce\\n\"", "nodePools[0].labels.corral.dev/fabric"),
    ("jaguar", "corral.dev/fabric: sf1-roce", "\"corral.dev/fabric\\n\": sf1-roce", r"nodePools[0].labels.corral.dev/fabric\n"),
    ("jaguar", "version: \"1.36.4\"", "version: \"1.36.4\\n\"", "kubernetes.version"),
    ("jaguar", "driver: \"580.173.02\"", "driver: \"580.173.02\\n\"", "nodePools[0].gpu.driver"),
    ("jaguar", "driver: \"580.173.02\"", "driver: \"5٨0.173.02\"", "nodePools[0].gpu.driver"),
    ("jaguar", "model: H100", "model: \"H100\\n\"", "nodePools[0].gpu.model"),
    ("jaguar", "region: eastus2", "region: \"eastus2$(id)\"", "controlPlane.region"),
    ("jaguar", "site: sf1", "site: \"sf1\\n\"", "nodePools[0].site"),
    ("jaguar", "hosts: [\"gpu-[001:064].sf1.internal\"]", "hosts: [\"gpu-[001:064].sf1.internal\\n\"]",
     "nodePools[0].hosts[0]"),
    ("jaguar", "machineType: Standard_D64s_v5", "machineType: \"Standard_D64s_v5\\n\"",
     "nodePools[2].machineType"),
    ("jaguar", "type: PremiumV2_LRS", "type: \"PremiumV2_LRS'\"", "controlPlane.etcd.disk.type"),
    ("jaguar", "reservedPools: [gpu-h100-robotics]", "reservedPools: [\"gpu-h100-robotics\\n\"]",
     "scheduling.teams[0].reservedPools[0]"),
    ("heron", HERON_DESCRIPTION, "description: \"{{ lookup('env', 'HOME') }}\"", "description"),
    ("heron", HERON_DESCRIPTION, "description: \"line\\nmore\"", "description"),
    ("heron", HERON_DESCRIPTION, "description: \"text \\u202e txet\"", "description"),
    ("heron", "zones: [us-west-2a, us-west-2b, us-west-2c]", "zones: [\"us-west-2a\\n\", us-west-2b, us-west-2c]",
     "controlPlane.zones[0]"),
]


@pytest.mark.parametrize("name, old, new, field", HOSTILE)
def test_hostile_free_text_is_refused(tmp_path, name, old, new, field):
    found = variant(tmp_path, name, old, new)
    assert found, f"{new!r} was accepted"
    assert any(f": {field}: " in line for line in found), found
    for line in found:
        # One line per problem, whatever the value held.
        assert "\n" not in line and "\r" not in line


def test_problem_lines_never_carry_control_characters(tmp_path):
    found = variant(tmp_path, "jaguar", "corral.dev/fabric: sf1-roce", "\"corral.dev/fabric\\e[2J\\n\": sf1-roce")
    assert found and all(line.isprintable() for line in found), found


def test_examples_keep_their_values(tmp_path):
    # The shapes take what real files say: the examples stay valid.
    assert problems(tmp_path, {f"{n}.yaml": example(n) for n in ("heron", "ibis", "jaguar")}) == []


@pytest.mark.parametrize("value", [
    "http://mirror.sf1.internal", "https://mirror.sf1.internal:8443/debian-mirror/", "http://10.50.0.9",
    "http://[fd00::9]:3142/apt",
])
def test_mirror_urls_that_are_fine(tmp_path, value):
    assert variant(tmp_path, "jaguar", "aptMirror: http://mirror.sf1.internal", f"aptMirror: \"{value}\"") == []


# --- site networks must be private -------------------------------------------


def test_public_site_cidr_is_refused(tmp_path):
    found = only(variant(tmp_path, "jaguar", "cidrs: [10.50.0.0/16]", "cidrs: [10.50.0.0/16, 128.0.0.0/1]"))
    assert ": sites[0].cidrs[1]: 128.0.0.0/1 is not a private network" in found
    assert "allowPublicCIDRs" in found


@pytest.mark.parametrize("cidr", ["172.16.0.0/12", "192.168.10.0/24", "100.64.0.0/16", "fd00:50::/48"])
def test_private_site_cidrs_pass(tmp_path, cidr):
    assert variant(tmp_path, "jaguar", "cidrs: [10.50.0.0/16]", f"cidrs: [\"{cidr}\"]") == []


def test_public_site_cidr_when_the_site_allows_it(tmp_path):
    new = "cidrs: [10.50.0.0/16, 198.51.100.0/24]\n    allowPublicCIDRs: true"
    assert variant(tmp_path, "jaguar", "cidrs: [10.50.0.0/16]", new) == []


@pytest.mark.parametrize("old, new, field", [
    ("podCIDR: 10.128.0.0/14", "podCIDR: 11.128.0.0/14", "kubernetes.podCIDR"),
    ("serviceCIDR: 10.96.0.0/16", "serviceCIDR: 8.8.0.0/16", "kubernetes.serviceCIDR"),
    ("networkCIDR: 10.200.0.0/20", "networkCIDR: 52.0.0.0/20", "controlPlane.networkCIDR"),
])
def test_cluster_networks_must_be_private(tmp_path, old, new, field):
    found = only(variant(tmp_path, "jaguar", old, new))
    assert f": {field}: " in found and "is not a private network" in found


# --- size and depth ------------------------------------------------------------


def _nested(depth: int) -> str:
    return example("heron") + "extra: " + "[" * depth + "]" * depth + "\n"


def test_deep_nesting_is_refused_with_a_position():
    doc = Document(Path("deep.yaml"), _nested(MAX_DEPTH + 10))
    with pytest.raises(ValidationFailed) as failed:
        parse_document(doc)
    problem = only([str(p) for p in failed.value.problems])
    line = example("heron").count("\n") + 1
    assert problem.startswith(f"deep.yaml:{line}:")
    assert f"nested deeper than {MAX_DEPTH} levels" in problem


def test_block_nesting_counts_too():
    text = example("heron") + "extra:\n" + "".join("  " * i + "- \n" for i in range(MAX_DEPTH + 5))
    with pytest.raises(ValidationFailed, match="nested deeper"):
        parse_document(Document(Path("deep.yaml"), text))


def test_anchors_cannot_stack_shallow_pieces_into_a_deep_tree():
    half = MAX_DEPTH // 2 + 2
    text = example("heron") + (
        f"x1: &x1 {'[' * half}1{']' * half}\n"
        f"x2: &x2 {'[' * half}*x1{']' * half}\n"
    )
    with pytest.raises(ValidationFailed) as failed:
        parse_document(Document(Path("alias.yaml"), text))
    assert "nested deeper" in str(failed.value)
    assert failed.value.problems[0].line == example("heron").count("\n") + 2


def test_nesting_just_within_the_limit_is_an_ordinary_problem():
    with pytest.raises(ValidationFailed) as failed:
        parse_document(Document(Path("ok.yaml"), _nested(MAX_DEPTH - 2)))
    assert "unknown key 'extra'" in str(failed.value)


def test_oversized_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("w") as handle:
        handle.write(example("heron"))
        handle.write("#" * (MAX_FILE_BYTES + 1) + "\n")
    with pytest.raises(ValidationFailed) as failed:
        parse_document(Document.read(path))
    assert str(failed.value) == (
        f"{path}:1:1: (file): file is larger than {MAX_FILE_BYTES:,} bytes, the most a cluster file may have")


def test_a_device_is_not_read_forever():
    with pytest.raises(ValidationFailed, match="not a regular file"):
        Document.read(Path("/dev/zero"))


@pytest.mark.parametrize("depth", [20_000, 30_000, 200_000])
def test_the_cli_survives_very_deep_files(tmp_path, depth):
    folder = tmp_path / "clusters"
    folder.mkdir()
    (folder / "heron.yaml").write_text(_nested(depth))
    result = subprocess.run(
        [sys.executable, "-m", "corral", "validate", "--clusters", str(folder)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stdout + result.stderr
    assert f"heron.yaml:{example('heron').count(chr(10)) + 1}:" in result.stdout
    assert f"(file): YAML nested deeper than {MAX_DEPTH} levels" in result.stdout


def test_host_patterns_are_counted_before_anything_expands_them(tmp_path):
    pools = "".join(
        f"  - {{name: big-{i}, provider: onprem, site: sf1, hosts: [\"h{i}-[000001:090000].sf1.internal\"]}}\n"
        for i in range(40)
    )
    text = example("jaguar").replace("nodePools:\n", "nodePools:\n" + pools, 1)
    import time
    started = time.monotonic()
    found = problems(tmp_path, {"jaguar.yaml": text})
    assert time.monotonic() - started < 20
    assert any(": nodePools: the on-prem pools name 3,600,072 hosts; a cluster may have at most 100,000" in f
               for f in found), found


# --- the JSON Schema carries the same shapes, in the form editors use -----------


def _patterns(node):
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        for value in node.values():
            yield from _patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _patterns(value)


def test_schema_patterns_are_ecma_anchored_and_hold_the_examples():
    import json

    import jsonschema

    from corral.model.render import json_schema_text

    from .helpers import EXAMPLES

    schema = json.loads(json_schema_text())
    patterns = list(_patterns(schema))
    assert len(patterns) >= 12
    # ECMA-262 (editors) knows no \Z; its `$` is the end of the text.
    assert all(p.startswith("^") and p.endswith("$") and "\\Z" not in p for p in patterns), patterns
    validator = jsonschema.Draft202012Validator(schema)
    from ruamel.yaml import YAML

    for name in ("heron", "ibis", "jaguar"):
        data = YAML(typ="safe").load((EXAMPLES / f"{name}.yaml").read_text())
        assert not list(validator.iter_errors(data)), name
        data["controlPlane"]["region"] = "us west 2; id"
        assert list(validator.iter_errors(data)), name


def test_a_huge_unknown_key_is_cut_in_the_report(tmp_path):
    found = only(variant(tmp_path, "heron", "kind: Cluster\n", "kind: Cluster\n" + "k" * 1000 + ": 1\n"))
    assert "unknown key 'kkkk" in found and "...'" in found and len(found) < 400
