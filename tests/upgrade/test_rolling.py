"""Cloud pools' rolling policy, read from the golden plans of heron (AWS), ibis
(GCP) and jaguar (Azure): CPU pools roll surge-first on a new template, GPU
pools are never rolled by a deploy (corral/machine/rollout.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.machine.rollout import KUBELET_HEALTHZ_PORT, SURGE_PERCENT
from corral.model import load_cluster

ROOT = Path(__file__).resolve().parents[2]


def resources(cluster: str, type_: str) -> list[dict]:
    plan = json.loads((ROOT / "tests" / "golden" / "plans" / f"{cluster}.json").read_text())
    return [r for r in plan["resources"] if r["type"] == type_]


def gpu_pools(cluster: str) -> set[str]:
    return {p.name for p in load_cluster(ROOT / "clusters" / f"{cluster}.yaml").cloud_pools if p.gpu}


def test_aws_cpu_groups_refresh_surge_first_and_gpu_groups_do_not():
    groups = resources("heron", "aws:autoscaling/group:Group")
    gpu = gpu_pools("heron")
    assert gpu and len(groups) > len(gpu)
    for group in groups:
        pool = next(t["value"] for t in group["inputs"]["tags"] if t["key"] == "corral-pool")
        refresh = group["inputs"].get("instanceRefresh")
        if pool in gpu:
            assert refresh is None, group["name"]
        else:
            assert refresh["strategy"] == "Rolling"
            prefs = refresh["preferences"]
            assert prefs["minHealthyPercentage"] == 100 and prefs["maxHealthyPercentage"] == 100 + SURGE_PERCENT


def test_gcp_cpu_migs_surge_without_unavailability_and_gpu_migs_stay_opportunistic():
    migs = resources("ibis", "gcp:compute/instanceGroupManager:InstanceGroupManager")
    gpu = gpu_pools("ibis")
    for mig in migs:
        policy = mig["inputs"]["updatePolicy"]
        pool = mig["inputs"]["description"].split()[1]
        if pool in gpu:
            assert policy == {"minimalAction": "REPLACE", "type": "OPPORTUNISTIC"}
        else:
            assert policy["type"] == "PROACTIVE" and policy["maxSurgeFixed"] >= 1
            assert policy["maxUnavailableFixed"] == 0


@pytest.mark.parametrize("cluster", ["jaguar"])
def test_azure_cpu_scale_sets_roll_with_surge_and_the_kubelet_as_health(cluster):
    sets = resources(cluster, "azure-native:compute:VirtualMachineScaleSet")
    gpu = gpu_pools(cluster)
    assert sets
    for vmss in sets:
        pool = vmss["inputs"]["tags"]["corral-pool"]
        policy = vmss["inputs"]["upgradePolicy"]
        extensions = (vmss["inputs"]["virtualMachineProfile"].get("extensionProfile") or {}).get("extensions", [])
        if pool in gpu:
            assert policy == {"mode": "Manual"} and not extensions
        else:
            assert policy["mode"] == "Rolling" and policy["rollingUpgradePolicy"]["maxSurge"] is True
            health = [e for e in extensions if e["type"] == "ApplicationHealthLinux"]
            assert health and health[0]["settings"] == {"protocol": "http", "port": KUBELET_HEALTHZ_PORT,
                                                        "requestPath": "/healthz"}


def test_every_node_stops_its_pods_gracefully_when_its_machine_shuts_down():
    """A provider rolling update or scale-in shuts the machine down: the kubelet's
    graceful node shutdown (shared KubeletConfiguration, published by kubeadm to
    every joining node) gives pods their SIGTERM within the clouds' shutdown window."""
    import yaml

    from corral.machine.api_server import render_kubeadm_init_config
    from corral.model.layout import layout

    for name in ("heron", "ibis", "jaguar"):
        cluster = load_cluster(ROOT / "clusters" / f"{name}.yaml")
        docs = {d["kind"]: d for d in yaml.safe_load_all(render_kubeadm_init_config(cluster, layout(cluster), []))
                if d}
        kubelet = docs["KubeletConfiguration"]
        assert kubelet["shutdownGracePeriod"] == "90s" and kubelet["shutdownGracePeriodCriticalPods"] == "20s"


def test_gpu_pool_nodes_carry_the_fingerprint_of_the_template_they_boot_from():
    """A driver, machine type, label or version change is a new template; scaling and zones are not.
    CPU pools carry none (their provider rolls them on every template change)."""
    from corral.machine.rollout import TEMPLATE_LABEL, pool_template_fingerprint, template_labels

    heron = load_cluster(ROOT / "clusters" / "heron.yaml")
    pool = heron.pool("gpu-a10g")
    base = pool_template_fingerprint(heron, pool)
    assert len(base) == 16 and int(base, 16) >= 0
    same = [pool.model_copy(update={"max_size": 999, "min_size": 3, "zones": ["us-west-2c"]})]
    changed = [pool.model_copy(update={"machine_type": "g5.24xlarge"}),
               pool.model_copy(update={"gpu": pool.gpu.model_copy(update={"driver": "550.163.01"})}),
               pool.model_copy(update={"labels": {**pool.labels, "tier": "gold"}})]
    assert all(pool_template_fingerprint(heron, p) == base for p in same)
    assert len({base, *(pool_template_fingerprint(heron, p) for p in changed)}) == 1 + len(changed)
    newer = heron.model_copy(update={"kubernetes": heron.kubernetes.model_copy(update={"version": "1.31.4"})})
    assert pool_template_fingerprint(newer, pool) != base
    assert template_labels(heron, pool) == {TEMPLATE_LABEL: base}
    assert template_labels(heron, heron.pool("cpu-m7i")) == {}
    # What the pools' user data registers the nodes with (golden plan, AWS user data is base64,
    # gzipped when it would not fit EC2's 16 KiB: corral/infra/aws/common.py).
    import base64
    import gzip

    def text_of(value: str) -> str:
        raw = base64.b64decode(value)
        return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()

    user_data = [text_of(r["inputs"]["userData"]) for r in resources("heron", "aws:ec2/launchTemplate:LaunchTemplate")]
    assert sum(f"{TEMPLATE_LABEL}={base}" in text for text in user_data) == 1
    assert sum(TEMPLATE_LABEL in text for text in user_data) == len(gpu_pools("heron"))
