"""Cloud GPU pools against their machine types (corral/model/gpu_catalog.py, issue 26 item 1)."""

from __future__ import annotations

import json

import pytest

from corral.model import load_fleet
from corral.model.gpu_catalog import CATALOG, GPU_MODELS, closest, gpu_machine
from corral.model.rules import machine_type_error
from corral.model.schema import Cluster
from tests.model.helpers import EXAMPLES, example, line_of, problems, variant

HERON_A10G = "    machineType: g5.12xlarge\n    zones: [us-west-2a, us-west-2b]\n    gpu: {model: A10G, count: 4}\n"


def heron_pool(machine: str, gpu: str | None) -> str:
    """Heron's gpu-a10g pool on `machine`, with `gpu` as its flow mapping (None: no gpu block)."""
    return f"    machineType: {machine}\n    zones: [us-west-2a, us-west-2b]\n" + (f"    gpu: {gpu}\n" if gpu else "")


def with_floor(text: str, model: str) -> str:
    """The example with a 0 burn-in floor for `model` as well: a multi-GPU pool of a model without a
    published all-reduce baseline must name one (health.burnIn.ncclMinBusGBps, docs/gpu-health.md)."""
    assert "ncclMinBusGBps: {" in text
    return text.replace("ncclMinBusGBps: {", f"ncclMinBusGBps: {{{model}: 0, ", 1)


def load(tmp_path, name: str, old: str, new: str, floor: str | None = None):
    text = example(name)
    assert old in text
    folder = tmp_path / "fleet"
    folder.mkdir()
    text = text.replace(old, new, 1)
    (folder / f"{name}.yaml").write_text(with_floor(text, floor) if floor else text)
    return load_fleet([folder]).clusters[name]


# --- The four files, which all validated before ------------------------------


def test_a_cpu_instance_with_gpus_is_refused(tmp_path):
    found = variant(tmp_path, "heron", "    machineType: m7i.16xlarge\n",
                    "    machineType: m7i.2xlarge\n    gpu: {model: H100, count: 8}\n")
    line = line_of("heron", "m7i.16xlarge") + 1
    assert found == [
        (f"heron.yaml:{line}:5: nodePools[0].gpu: m7i.2xlarge has no GPUs (AWS GPU machines are the P and G "
        "families, like p5.48xlarge or g6.xlarge); remove gpu, or use a GPU machine type")
    ]


def test_a_small_g5_with_eight_h100_is_refused_on_model_and_count(tmp_path):
    found = variant(tmp_path, "heron", HERON_A10G, heron_pool("g5.xlarge", "{model: H100, count: 8}"))
    line = line_of("heron", "gpu: {model: A10G, count: 4}")
    assert found == [
        (f"heron.yaml:{line}:11: nodePools[1].gpu.model: g5.xlarge has 1 A10G (22.4 GiB each), not H100; "
        "use model: A10G, or leave gpu out to take the machine's"),
        (f"heron.yaml:{line}:24: nodePools[1].gpu.count: g5.xlarge has 1 A10G (22.4 GiB each), not 8 GPUs: "
        "a machine always brings all of them; use count: 1, or leave gpu out to take the machine's"),
    ]


def test_a_p5_with_four_gpus_is_refused(tmp_path):
    found = variant(tmp_path, "heron", HERON_A10G, heron_pool("p5.48xlarge", "{model: H100, count: 4}"))
    assert len(found) == 1
    assert "nodePools[1].gpu.count: p5.48xlarge has 8 H100 (80 GiB each, NVSwitch), not 4 GPUs" in found[0]


@pytest.mark.parametrize("typo, meant", [("H1OO", "H100"), ("h100", "H100"), ("a10g", "A10G"),
                                         ("L40s", "L40S")])
def test_an_unknown_gpu_model_is_refused_with_a_guess(tmp_path, typo, meant):
    found = variant(tmp_path, "heron", "gpu: {model: A10G, count: 4}", f"gpu: {{model: {typo}, count: 4}}")
    assert len(found) == 1
    assert f"nodePools[1].gpu.model: unknown GPU model '{typo}'; did you mean {meant}? (known: A10," in found[0]


def test_an_unknown_model_without_a_likely_one_lists_the_known(tmp_path):
    found = variant(tmp_path, "heron", "gpu: {model: A10G, count: 4}", "gpu: {model: Voodoo5, count: 4}")
    assert len(found) == 1
    assert "unknown GPU model 'Voodoo5' (known: A10, A10G," in found[0] and "did you mean" not in found[0]


def test_on_prem_pools_are_checked_against_the_model_list(tmp_path):
    old = 'gpu: {model: H100, count: 8, driver: "580.173.02", fabricManager: true}'
    found = variant(tmp_path, "jaguar", old, old.replace("H100", "H1OO"))
    assert len(found) == 1
    assert "nodePools[0].gpu.model: unknown GPU model 'H1OO'; did you mean H100?" in found[0]


# --- Filling the gpu block from the machine type ---------------------------------------


def test_a_p5_pool_without_gpu_gets_eight_h100_and_fabric_manager(tmp_path):
    cluster = load(tmp_path, "heron", HERON_A10G, heron_pool("p5.48xlarge", None))
    gpu = cluster.pool("gpu-a10g").gpu
    assert (gpu.model, gpu.count, gpu.fabric_manager) == ("H100", 8, True)
    labels = cluster.node_labels(cluster.pool("gpu-a10g"))
    assert labels["corral.dev/gpu-model"] == "H100" and labels["nvidia.com/gpu.present"] == "true"


def test_a_g5_pool_without_gpu_gets_its_a10g_without_fabric_manager(tmp_path):
    cluster = load(tmp_path, "heron", HERON_A10G, heron_pool("g5.12xlarge", None))
    gpu = cluster.pool("gpu-a10g").gpu
    assert (gpu.model, gpu.count, gpu.fabric_manager) == ("A10G", 4, False)


def test_a_slice_of_an_nvswitch_host_is_filled_without_fabric_manager(tmp_path):
    old = ("    machineType: a2-highgpu-8g\n    zones: [us-central1-a, us-central1-c]\n"
           "    # 8 A100s joined by NVSwitch: the fabric manager must run (docs/gpu-machines.md).\n"
           "    gpu: {model: A100, count: 8, fabricManager: true}\n")
    cluster = load(tmp_path, "ibis", old, "    machineType: a3-highgpu-2g\n    zones: [us-central1-a, us-central1-c]\n",
                   floor="H100")
    gpu = cluster.pool("gpu-a100").gpu
    assert (gpu.model, gpu.count, gpu.fabric_manager) == ("H100", 2, False)


def test_a_cpu_pool_stays_without_gpu():
    assert load_fleet([EXAMPLES]).clusters["heron"].pool("cpu-m7i").gpu is None


# --- fabricManager against NVSwitch ----------------------------------------------------


def test_fabric_manager_on_pcie_cards_is_refused(tmp_path):
    found = variant(tmp_path, "heron", "gpu: {model: A10G, count: 8}",
                    "gpu: {model: A10G, count: 8, fabricManager: true}")
    assert len(found) == 1
    assert ("nodePools[2].gpu.fabricManager: g5.48xlarge has 8 A10G (22.4 GiB each): no NVSwitch, so "
            "NVIDIA's fabric manager has nothing to manage and fails to start; remove fabricManager") in found[0]


def test_fabric_manager_off_on_an_nvswitch_machine_is_refused(tmp_path):
    found = variant(tmp_path, "heron", HERON_A10G,
                    heron_pool("p5e.48xlarge", "{model: H200, count: 8, fabricManager: false}"))
    assert len(found) == 1
    assert "nodePools[1].gpu.fabricManager: p5e.48xlarge has 8 H200 (141 GiB each, NVSwitch): CUDA cannot use" \
        in found[0]


def test_a_declared_block_that_matches_is_accepted(tmp_path):
    assert variant(tmp_path, "heron", HERON_A10G,
                   heron_pool("p5en.48xlarge", "{model: H200, count: 8, fabricManager: true}")) == []


# --- Machine types the catalog does not list -----------------------------------------


def test_a_gpu_looking_type_the_catalog_lacks_must_declare_its_gpus(tmp_path):
    found = variant(tmp_path, "heron", HERON_A10G, heron_pool("p5.48xlarg", None))
    line = line_of("heron", "g5.12xlarge")
    assert found == [
        (f"heron.yaml:{line}:5: nodePools[1].machineType: 'p5.48xlarg' looks like a GPU machine type of AWS, but "
        "corral's catalog (docs/gpu-machines.md) does not list it (did you mean p5.48xlarge?); fix the name, "
        "or declare the pool's gpu (model and count) if it is a GPU machine the catalog lacks")
    ]


def test_a_gpu_type_the_catalog_lacks_is_trusted_as_declared(tmp_path):
    text = example("heron").replace(HERON_A10G, heron_pool("p6-b200.48xlarge", "{model: B200, count: 8, "
                                                             "fabricManager: true}"), 1)
    assert problems(tmp_path, {"heron.yaml": with_floor(text, "B200")}) == []


def test_gcp_n1_takes_attachable_gpus_only(tmp_path):
    old = "    machineType: g2-standard-48\n    gpu: {model: L4, count: 4}\n"
    (tmp_path / "t4").mkdir()
    (tmp_path / "a100").mkdir()
    t4 = example("ibis").replace(old, "    machineType: n1-standard-16\n    gpu: {model: T4, count: 4}\n", 1)
    assert problems(tmp_path / "t4", {"ibis.yaml": with_floor(t4, "T4")}) == []
    found = variant(tmp_path / "a100", "ibis", old,
                    "    machineType: n1-standard-16\n    gpu: {model: A100, count: 4}\n")
    assert len(found) == 1
    assert "gpu.model: GCP attaches only T4, V100, P100, P4 to N1 machines, not A100" in found[0]


def test_azure_cpu_size_with_gpus_is_refused(tmp_path):
    found = variant(tmp_path, "jaguar", "    machineType: Standard_D64s_v5\n",
                    "    machineType: Standard_D64s_v5\n    gpu: {model: H100, count: 8}\n")
    assert len(found) == 1
    assert "gpu: Standard_D64s_v5 has no GPUs (Azure GPU machines are the N series" in found[0]


def test_an_azure_nd_size_without_gpu_is_filled(tmp_path):
    files = {"jaguar.yaml": example("jaguar").replace(
        "    machineType: Standard_D64s_v5\n", "    machineType: Standard_ND96isr_H100_v5\n", 1)}
    assert problems(tmp_path, files) == []
    folder = tmp_path / "fleet"
    pool = load_fleet([folder]).clusters["jaguar"].pool("cpu-d64")
    assert (pool.gpu.model, pool.gpu.count, pool.gpu.fabric_manager) == ("H100", 8, True)


# --- The catalog itself ------------------------------------------------------------------


@pytest.mark.parametrize("cloud, machine_type, model, count, memory, nvswitch, fabric, nics", [
    # AWS: EC2 DescribeInstanceTypes (karpenter-provider-aws instance-types.md)
    ("aws", "g5.xlarge", "A10G", 1, 22.4, False, None, None),
    ("aws", "g5.12xlarge", "A10G", 4, 22.4, False, "efa", 1),
    ("aws", "g5.48xlarge", "A10G", 8, 22.4, False, "efa", 1),
    ("aws", "g6.48xlarge", "L4", 8, 22.4, False, "efa", 1),
    ("aws", "g6e.48xlarge", "L40S", 8, 44.7, False, "efa", 4),
    ("aws", "p4d.24xlarge", "A100", 8, 40, True, "efa", 4),
    ("aws", "p4de.24xlarge", "A100", 8, 80, True, "efa", 4),
    ("aws", "p5.48xlarge", "H100", 8, 80, True, "efa", 32),
    ("aws", "p5e.48xlarge", "H200", 8, 141, True, "efa", 32),
    ("aws", "p5en.48xlarge", "H200", 8, 141, True, "efa", 16),
    # GCP: cluster-toolkit gpu-definition and blueprints
    ("gcp", "a2-highgpu-8g", "A100", 8, 40, True, None, None),
    ("gcp", "a2-megagpu-16g", "A100", 16, 40, True, None, None),
    ("gcp", "a2-ultragpu-1g", "A100", 1, 80, None, None, None),
    ("gcp", "a3-highgpu-8g", "H100", 8, 80, True, "gpudirect-tcpx", 4),
    ("gcp", "a3-megagpu-8g", "H100", 8, 80, True, "gpudirect-tcpxo", 8),
    ("gcp", "a3-ultragpu-8g", "H200", 8, 141, True, "gpudirect-rdma", 8),
    ("gcp", "a4-highgpu-8g", "B200", 8, None, True, "gpudirect-rdma", 8),
    ("gcp", "g2-standard-32", "L4", 1, None, False, None, None),
    ("gcp", "g2-standard-96", "L4", 8, None, False, None, None),
    # Azure: size pages
    ("azure", "Standard_ND96asr_v4", "A100", 8, 40, True, "infiniband", 8),
    ("azure", "Standard_ND96isr_H200_v5", "H200", 8, 141, True, "infiniband", 8),
    ("azure", "Standard_NC96ads_A100_v4", "A100", 4, 80, False, None, None),
    ("azure", "Standard_NC80adis_H100_v5", "H100", 2, 94, False, None, None),
])
def test_catalog_rows(cloud, machine_type, model, count, memory, nvswitch, fabric, nics):
    machine = gpu_machine(cloud, machine_type)
    assert (machine.gpu_model, machine.gpu_count, machine.gpu_memory_gib, machine.nvswitch, machine.fabric,
            machine.fabric_nics) == (model, count, memory, nvswitch, fabric, nics)


@pytest.mark.parametrize("cloud, machine_type, smi_name", [
    # What nvidia-smi --query-gpu=name reports on these machines (the hostlab
    # fakes use the same names).
    ("aws", "g5.xlarge", "NVIDIA A10G"),
    ("aws", "g6e.xlarge", "NVIDIA L40S"),
    ("aws", "p4de.24xlarge", "NVIDIA A100-SXM4-80GB"),
    ("aws", "p5.48xlarge", "NVIDIA H100 80GB HBM3"),
    ("azure", "Standard_NC24ads_A100_v4", "NVIDIA A100 80GB PCIe"),
    ("azure", "Standard_NC40ads_H100_v5", "NVIDIA H100 NVL"),
])
def test_the_preflight_finds_the_catalog_model_in_what_nvidia_smi_reports(cloud, machine_type, smi_name):
    # gpu-preflight.py.j2 refuses a node whose GPU name does not have the
    # pool's model as a whole word, which is why 80 GB A100s and H100 NVLs are A100 and H100.
    import re

    words = re.split(r"[^a-z0-9]+", smi_name.lower())  # as gpu-preflight.py.j2's model_matches reads them
    assert gpu_machine(cloud, machine_type).gpu_model.lower() in words


def test_every_row_is_a_machine_type_of_its_cloud_with_a_known_model():
    for (cloud, machine_type), machine in CATALOG.items():
        assert machine_type_error(cloud, machine_type) is None, machine_type
        assert machine.gpu_model in GPU_MODELS
        # Fabric manager runs only where a whole HGX board (8 or 16 GPUs) is in the machine.
        assert not machine.nvswitch or machine.gpu_count >= 8, machine_type


def test_the_examples_gpu_pools_match_the_catalog():
    fleet = load_fleet([EXAMPLES])
    checked = 0
    for cluster in fleet.clusters.values():
        for pool in cluster.cloud_pools:
            machine = gpu_machine(pool.provider, pool.machine_type)
            if machine is not None:
                assert (pool.gpu.model, pool.gpu.count) == (machine.gpu_model, machine.gpu_count)
                checked += 1
    assert checked >= 4  # heron's two G5 pools, ibis's A2 and G2 pools


def test_closest_folds_the_usual_slips():
    assert closest("h1oo", GPU_MODELS) == "H100"
    assert closest("l40 s", GPU_MODELS) == "L40S"
    assert closest("Voodoo5", GPU_MODELS) is None


def test_the_json_schema_lists_the_models():
    schema = json.dumps(Cluster.model_json_schema(by_alias=True))
    assert '"enum": [' + ", ".join(f'"{m}"' for m in GPU_MODELS) + "]" in schema
