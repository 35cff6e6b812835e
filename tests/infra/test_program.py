"""The Pulumi program: which components it builds, with what, and what it exports.

Most tests use the fake cloud package (tests/infra/fake_platform.py) so they
test the program alone; the end-to-end ones plan the examples with the real
cloud packages, as `corral plan` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from corral.infra import program
from corral.infra.outputs import OUTPUT_KEYS
from corral.infra.plan import SECRET, UNKNOWN, PlanError, plan_cluster
from corral.model import load_fleet

from .conftest import CERT_PEM, EXAMPLES, ROOT, edited_cluster


def example(name: str):
    return load_fleet([EXAMPLES]).clusters[name]


def test_each_component_gets_its_members_and_user_data(fake_plan, fake):
    jaguar = example("jaguar")
    fake_plan(jaguar)
    (etcd,) = fake.calls["Etcd"]  # 272 nodes: no dedicated events cluster
    assert [m.name for m in etcd["members"]] == [f"jaguar-etcd-{i}" for i in range(5)]
    assert len(etcd["user_data"]) == 5
    (api,) = fake.calls["ApiServers"]
    assert len(api["user_data"]) == 5
    (pools,) = fake.calls["NodePools"]
    assert set(pools["user_data"]) == {"cpu-d64"}  # cloud pools only, never on-prem ones
    (link,) = fake.calls["HybridLink"]
    assert set(link["shared_keys"]) == {"sf1"}
    assert fake.calls["Network"][0]["name"] == "jaguar-network"


def test_a_dedicated_events_cluster_is_a_second_etcd(fake_plan, fake, cluster_variant):
    jaguar = cluster_variant("jaguar", {"members: 5 ": "members: 5\n    dedicatedEventsCluster: true "})
    plan = fake_plan(jaguar)
    etcds = fake.calls["Etcd"]
    assert [call["name"] for call in etcds] == ["jaguar-etcd", "jaguar-etcd-events"]
    assert [m.name for m in etcds[1]["members"]] == [f"jaguar-etcd-events-{i}" for i in range(5)]
    # The events members get certificates too.
    names = {r["name"] for r in plan.resources}
    assert {f"etcd-server-jaguar-etcd-events-{i}" for i in range(5)} <= names


def test_no_vpn_no_hybrid_link_and_no_cloud_pools_no_node_pools(fake_plan, fake):
    heron = example("heron")  # cloud-only: no sites
    plan = fake_plan(heron)
    assert "HybridLink" not in fake.calls
    assert plan.outputs["vpn"] == {}
    assert "corral:fake:HybridLink" not in {r["type"] for r in plan.resources}


def test_on_prem_only_cluster_has_no_node_pools(fake_plan, fake, cluster_variant):
    jaguar = cluster_variant("jaguar", {
        "  - name: cpu-d64\n    provider: azure\n    machineType: Standard_D64s_v5\n"
        '    zones: ["1", "2", "3"]\n    minSize: 0\n    maxSize: 200\n': "",
    })
    fake_plan(jaguar)
    assert "NodePools" not in fake.calls
    assert "HybridLink" in fake.calls


def test_stack_outputs(fake_plan):
    plan = fake_plan(example("jaguar"))
    assert set(plan.outputs) == set(OUTPUT_KEYS)
    assert plan.outputs["apiEndpoint"] == "10.200.0.5:6443"
    for key in ("bootstrapToken", "adminKubeconfig", "vpnSharedKeys"):
        assert plan.outputs[key] == SECRET
    # A preview: the CA is only known after a real apply.
    assert plan.outputs["caCertificate"] == UNKNOWN
    assert plan.outputs["vpn"]["sf1"]["gatewayAddress"] == "198.51.100.7"


def test_stack_outputs_after_apply(fake_plan, known_secret_mocks):
    """With the providers' values known, the CA and its kubeadm hash come out in clear."""
    from corral.infra.pki import ca_cert_hash

    plan = fake_plan(example("jaguar"), mocks=known_secret_mocks, preview=False)
    assert plan.outputs["caCertificate"] == CERT_PEM
    assert plan.outputs["caCertHash"] == ca_cert_hash(CERT_PEM)
    assert plan.outputs["bootstrapToken"] == SECRET


def test_user_data_holds_references_and_the_secrets_are_secret(fake_plan, known_secret_mocks):
    plan = fake_plan(example("jaguar"), mocks=known_secret_mocks, preview=False)
    vms = [r for r in plan.resources if r["type"] == "fake:index:Vm"]
    assert len(vms) == 10
    groups = [r for r in plan.resources if r["type"] == "fake:index:Group"]
    documents = [r["inputs"]["userData"] for r in (*vms, *groups)]
    # Plain (shown by `corral plan`), each naming its machine role's secret.
    assert all(d.startswith("#cloud-config") and "/usr/local/sbin/corral-fetch-secrets" in d for d in documents)
    assert all("PRIVATE KEY" not in d for d in documents)
    secrets = {r["name"]: r for r in plan.resources if r["type"] == "fake:index:Secret"}
    assert set(secrets) == {
        *(f"jaguar-secret-etcd-{i}" for i in range(5)), "jaguar-secret-apiserver", "jaguar-secret-pool-cpu-d64",
    }
    assert all(s["inputs"]["value"] == SECRET for s in secrets.values())
    for vm in vms:  # each machine names its own role's secret
        role = "apiserver" if "apiserver" in vm["name"] else vm["name"].split("-", 1)[1]
        assert f"its secrets: jaguar-{role} in" in vm["inputs"]["userData"], vm["name"]


def test_stack_cluster_comes_from_the_clusters_folder(tmp_path, monkeypatch):
    cluster, folder = edited_cluster(tmp_path, "ibis")
    monkeypatch.setenv(program.CLUSTERS_ENV, str(folder))
    assert program.load_stack_cluster("ibis").name == "ibis"
    with pytest.raises(program.ProgramError, match="stack 'kestrel' has no cluster file"):
        program.load_stack_cluster("kestrel")


def test_invalid_fleet_is_a_clear_error(tmp_path):
    _, folder = edited_cluster(tmp_path, "ibis")
    (folder / "ibis.yaml").write_text((folder / "ibis.yaml").read_text().replace("members: 3", "members: 4"))
    with pytest.raises(program.ProgramError) as raised:
        program.load_stack_cluster("ibis", folder)
    assert "do not validate" in str(raised.value) and "odd number" in str(raised.value)


def test_unknown_cloud_package_is_a_clear_error():
    with pytest.raises(program.ProgramError, match="no cloud package corral.infra.openstack"):
        program.cloud_package("openstack")


def test_cloud_errors_become_plan_errors(cluster_variant, monkeypatch):
    """A ValueError from a cloud package or the bootstrap is reported as one message."""
    from corral.machine import scheduler

    monkeypatch.setattr(scheduler, "SCHEDULER_PLUGINS_IMAGES", {})
    # Coscheduling on 1.31 (the last minors scheduler-plugins released for), its image taken away.
    cluster = cluster_variant("jaguar", {'version: "1.36.4"': 'version: "1.31.4"',
                                         "  binPacking: true\n": "  binPacking: true\n  coscheduling: true\n"})
    with pytest.raises(PlanError, match="cluster jaguar: .*scheduler-plugins release for Kubernetes 1.31"):
        plan_cluster(cluster)


def test_program_entry_point_keeps_its_folder_off_sys_path():
    """`pulumi up` runs corral/infra as a script folder; platform.py must not shadow the stdlib."""
    source = (ROOT / "corral" / "infra" / "__main__.py").read_text()
    code = (
        "import runpy, sys\n"
        "sys.modules.pop('platform', None)\n"
        f"src = {source!r}.replace('from corral.infra.program import run', 'run = lambda: None')\n"
        "ns = {'__file__': %r}\n" % str(ROOT / "corral" / "infra" / "__main__.py")
        + "exec(compile(src, ns['__file__'], 'exec'), ns)\n"
        "import platform\n"
        "print(platform.__file__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT / "corral" / "infra", capture_output=True, text=True, check=True,
    )
    assert "corral" not in result.stdout


@pytest.mark.parametrize("name", ["jaguar", "heron", "ibis"])
def test_corral_plan_json_end_to_end(name):
    """`corral plan NAME --format json` with the real cloud package: a JSON list of resources."""
    result = subprocess.run(
        [sys.executable, "-m", "corral", "plan", name, "--format", "json", "--clusters", str(EXAMPLES)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    resources = json.loads(result.stdout)
    assert {"type", "name", "parent", "protect", "inputs"} <= set(resources[0])
    types = {r["type"] for r in resources}
    cloud = {"jaguar": "azure", "heron": "aws", "ibis": "gcp"}[name]
    assert {f"corral:{cloud}:Network", f"corral:{cloud}:Etcd", f"corral:{cloud}:ApiServers",
            f"corral:{cloud}:NodePools", "corral:infra:Pki"} <= types
    assert ("PRIVATE KEY" in result.stdout) is False


def test_corral_plan_unknown_cluster_is_a_clear_error():
    result = subprocess.run(
        [sys.executable, "-m", "corral", "plan", "kestrel", "--clusters", str(EXAMPLES)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 1
    assert "no cluster 'kestrel'" in result.stderr and "Traceback" not in result.stderr


def test_corral_up_without_pulumi_cli(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "corral", "up", "heron", "--clusters", str(EXAMPLES)],
        cwd=ROOT, capture_output=True, text=True, env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
    )
    assert result.returncode == 1
    assert "pulumi CLI is not installed" in result.stderr and "Traceback" not in result.stderr


def test_pulumi_project_points_at_the_program():
    from ruamel.yaml import YAML

    project = YAML(typ="safe").load((ROOT / "Pulumi.yaml").read_text())
    assert project["runtime"] == "python"
    assert project["stackConfigDir"] == "stacks"
    assert (ROOT / project["main"] / "__main__.py").is_file()
    for name in ("jaguar", "heron", "ibis"):
        stack = YAML(typ="safe").load((ROOT / "stacks" / f"Pulumi.{name}.yaml").read_text())
        # Only provider settings: nothing of the cluster's shape.
        assert all(key.split(":")[0] in ("azure-native", "aws", "gcp", "corral") for key in stack["config"])


def test_plan_records_parent_protect_and_retain_from_the_wire(fake_plan):
    """MockResourceArgs has neither; the plan reads them off each RegisterResource request."""
    plan = fake_plan(example("heron"))
    by_name = {r["name"]: r for r in plan.resources}
    disk, vm, etcd = by_name["heron-etcd-0-data"], by_name["heron-etcd-0"], by_name["heron-etcd"]
    assert (disk["parent"], disk["protect"], disk["retainOnDelete"]) == ("heron-etcd", True, True)
    assert (vm["parent"], vm["protect"], vm["retainOnDelete"]) == ("heron-etcd", False, False)
    assert (etcd["type"], etcd["parent"], etcd["component"]) == ("corral:fake:Etcd", None, "heron-etcd")
    assert by_name["kubernetes-ca"]["parent"] == "heron-pki"
    assert disk["inputs"] == {"iops": 12000, "sizeGiB": 256, "type": "io2", "zone": "us-west-2a"}
    # Sorted: by component, the component first, then by type and name.
    keys = [(r["component"], r["name"] != r["component"], r["type"], r["name"]) for r in plan.resources]
    assert keys == sorted(keys)


def test_corral_plan_table_groups_by_component():
    result = subprocess.run(
        [sys.executable, "-m", "corral", "plan", "heron", "--full", "--clusters", str(EXAMPLES)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    for heading in ("heron-pki (", "heron-etcd (", "heron-network (", "heron-apiservers (", "heron-nodepools ("):
        assert heading in result.stdout
    volume_rows = [line for line in result.stdout.splitlines() if "heron-etcd-0-data" in line and "Volume" in line]
    assert volume_rows and "protect+retain" in volume_rows[0] and "iops=12000" in volume_rows[0]
    assert "bootstrapToken: [secret]" in result.stdout


def test_cli_and_scheduler_config_do_not_import_pulumi():
    """`corral validate` (and a manifests module reusing the scheduler config) stay free of cloud SDKs."""
    code = (
        "import sys\n"
        "import corral.cli\n"
        "from corral.machine.scheduler import render_scheduler_config\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('pulumi')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("depth", [3_000, 200_000])
def test_a_stack_file_nested_too_deep_is_a_clear_error(fleet_dir, depth):
    """Stack files go through the cluster files' reader: its size and depth limits, no
    RecursionError traceback, no crash of the YAML parser (issue 25, item 7)."""
    stacks = fleet_dir.parent / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.heron.yaml").write_text("config:\n  corral:x: " + "[" * depth + "]" * depth + "\n")
    result = subprocess.run([sys.executable, "-m", "corral", "plan", "heron", "--clusters", str(fleet_dir)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "cannot read stack settings" in result.stderr and "Pulumi.heron.yaml:2:" in result.stderr
    assert "nested deeper than 64 levels" in result.stderr and "Traceback" not in result.stderr
