"""Azure machines boot the stack's image: corral:gpuNodeImage for GPU pools, corral:nodeImage for the rest.

Through the core's plan runner (`corral plan`'s path: the real program under
Pulumi's mocks), on jaguar (Azure) with a cloud GPU pool added. Before this,
every Azure machine booted the Debian Marketplace image, which has no NVIDIA
driver (corral/infra/azure/common.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("pulumi_azure_native")

from corral.infra.plan import PlanError, plan_cluster  # noqa: E402

from .azure_fixtures import load  # noqa: E402

IMAGES = "/subscriptions/0b6f6c1e-2d3a-4c5b-9e8f-7a6b5c4d3e2f/resourceGroups/corral-images/providers/Microsoft.Compute"
NODE_IMAGE = f"{IMAGES}/images/corral-node"
GPU_IMAGE = f"{IMAGES}/galleries/corral/images/corral-gpu-node/versions/1.31.4"
GPU_POOL = {"name": "gpu-a100", "provider": "azure", "machineType": "Standard_NC24ads_A100_v4",
            "zones": ["2"], "minSize": 0, "maxSize": 4, "gpu": {"model": "A100", "count": 1}}
MARKETPLACE = {"publisher": "Debian", "offer": "debian-12", "sku": "12-gen2", "version": "latest"}


def with_gpu_pool(data: dict) -> None:
    data["nodePools"].append(dict(GPU_POOL))


def plan(config: dict[str, str], gpu_pool: bool = True):
    cluster = load("jaguar", pool=with_gpu_pool) if gpu_pool else load("jaguar")
    return plan_cluster(cluster, stack_config=config)


def image_of(resource: dict) -> dict:
    inputs = resource["inputs"]
    if resource["type"] == "azure-native:compute:VirtualMachineScaleSet":
        return inputs["virtualMachineProfile"]["storageProfile"]["imageReference"]
    return inputs["storageProfile"]["imageReference"]


def booted_images(result) -> dict[str, dict]:
    """Machine (VM or scale set) name -> its imageReference."""
    return {r["name"]: image_of(r) for r in result.resources
            if r["type"] in ("azure-native:compute:VirtualMachine", "azure-native:compute:VirtualMachineScaleSet")}


def test_gpu_pool_boots_gpu_node_image_and_the_rest_node_image():
    images = booted_images(plan({"corral:nodeImage": NODE_IMAGE, "corral:gpuNodeImage": GPU_IMAGE}))
    gpu_sets = {name for name in images if "gpu-a100" in name}
    assert gpu_sets, "the GPU pool has a scale set"
    for name, image in images.items():
        assert image == {"id": GPU_IMAGE if name in gpu_sets else NODE_IMAGE}, name
    # the control plane and the CPU pool are among them
    assert any("etcd" in name for name in images) and any("cpu-d64" in name for name in images)


def test_gpu_pool_boots_node_image_when_no_gpu_image_is_set():
    result = plan({"corral:nodeImage": NODE_IMAGE})
    assert set(map(lambda image: image["id"], booted_images(result).values())) == {NODE_IMAGE}
    assert not [d for d in result.diagnostics if "nodeImage is not set" in d]


def test_a_gpu_pool_without_an_image_is_refused_naming_the_stack_and_the_pool():
    with pytest.raises(PlanError) as refused:
        plan({})
    message = str(refused.value)
    assert "stacks/Pulumi.jaguar.yaml" in message and "GPU pool gpu-a100" in message
    assert "corral:gpuNodeImage" in message and "NVIDIA driver" in message


def test_without_images_and_gpu_pools_machines_boot_the_marketplace_image_with_a_warning():
    result = plan({}, gpu_pool=False)
    images = booted_images(result)
    assert images and all(image == MARKETPLACE for image in images.values())
    assert [d for d in result.diagnostics if "corral:nodeImage is not set" in d and "Marketplace" in d]


@pytest.mark.parametrize("bad", [
    "corral-gpu-node",                                              # a bare name, not an ARM id
    "Debian:debian-12:12-gen2:latest",                              # a Marketplace URN
    f"{IMAGES}/galleries/corral/images",                            # no image definition
    "/subscriptions/0/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v",  # not an image
])
def test_an_image_setting_that_is_not_an_image_id_is_refused_naming_the_key(bad):
    with pytest.raises(PlanError) as refused:
        plan({"corral:nodeImage": NODE_IMAGE, "corral:gpuNodeImage": bad})
    assert "corral:gpuNodeImage" in str(refused.value) and repr(bad) in str(refused.value)


def test_gallery_image_without_a_version_is_taken_as_its_latest():
    latest = f"{IMAGES}/galleries/corral/images/corral-gpu-node"
    images = booted_images(plan({"corral:nodeImage": NODE_IMAGE, "corral:gpuNodeImage": latest}))
    assert {"id": latest} in images.values()
