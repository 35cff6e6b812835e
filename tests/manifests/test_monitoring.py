"""The monitoring add-on at scale: direct scrapes only, shards, HA pairs on volumes,
retention and remote write from the cluster file, Grafana, and the rules under promtool.

promtool here is Debian's (`prometheus` package), built without Kubernetes
service discovery: `promtool check config` runs on a copy whose
`kubernetes_sd_configs` are swapped for file discovery (everything else -
relabelling, hashmod, TLS, auth, remote write - is checked as rendered), and
the Kubernetes discovery blocks are checked against their documented fields here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from corral.manifests import dashboards, monitoring
from corral.manifests.render import render
from corral.model.loader import load_fleet
from corral.model.schema import Cluster

from .test_manifests import variant

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "clusters"
FLEET = load_fleet([EXAMPLES])
NAMES = sorted(FLEET.clusters)
NS = "corral-monitoring"
API_SERVER_ADDRESSES = ("kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (apt-get install prometheus; scripts/install does)")


def monitoring_objects(cluster: Cluster) -> dict[str, dict]:
    addon = next(a for a in render(cluster) if a.name == "monitoring")
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in addon.objects}


def prometheus_files(cluster: Cluster) -> dict[str, str]:
    return monitoring_objects(cluster)["ConfigMap/prometheus-config"]["data"]


def configs(cluster: Cluster) -> dict[str, dict]:
    return {k: yaml.safe_load(v) for k, v in prometheus_files(cluster).items() if k.startswith("prometheus")}


def big(tmp_path: Path, hosts: int = 7_500) -> Cluster:
    """jaguar with its on-prem GPU pool grown so the cluster holds `hosts` + 72 + 200 nodes."""
    return variant(tmp_path, "jaguar", ('hosts: ["gpu-[001:064].sf1.internal"]',
                                        f'hosts: ["gpu-[00001:{hosts:05d}].sf1.internal"]'),
                   ('\n    racks: ["sf1-r[01:08]"]', ""),  # its 8 racks would not divide the grown pool
                   ("podCIDR: 10.128.0.0/14", "podCIDR: 10.128.0.0/11"))


# --- no scrape through the API server --------------------------------------------


def uses_api_server_as_proxy(job: dict) -> str | None:
    """Why `job` goes through the API server, or None. The `apiserver` job may scrape
    the API servers' own /metrics at their endpoints, nothing else."""
    text = json.dumps(job)
    if "proxy_url" in text or "/proxy" in text or "/api/v1/nodes" in text:
        return "proxy path or proxy_url"
    for rule in job.get("relabel_configs", []):
        if rule.get("target_label") in ("__address__", "__metrics_path__", "__scheme__"):
            if any(a in rule.get("replacement", "") for a in API_SERVER_ADDRESSES):
                return f"relabels {rule['target_label']} to the API server"
            if rule.get("target_label") == "__metrics_path__":
                return "rewrites the metrics path"
    for static in job.get("static_configs", []):
        if any(t.split(":")[0] in API_SERVER_ADDRESSES for t in static["targets"]):
            return "static target is the API server"
    if job.get("metrics_path", "/metrics").startswith("/api/"):
        return "metrics path is an API server path"
    return None


@pytest.mark.parametrize("name", NAMES)
def test_no_scrape_config_goes_through_the_api_server(name):
    for key, config in configs(FLEET.clusters[name]).items():
        for job in config["scrape_configs"]:
            assert uses_api_server_as_proxy(job) is None, (key, job["job_name"], uses_api_server_as_proxy(job))
        # The API servers' own metrics: their endpoints, their /metrics.
        for job in config["scrape_configs"]:
            if job["job_name"] == "apiserver":
                assert job.get("metrics_path", "/metrics") == "/metrics"
                assert job["kubernetes_sd_configs"][0]["role"] == "endpoints"


def test_the_proxy_check_catches_the_old_api_server_proxy_scrape():
    """What the add-on used to do (cAdvisor through /api/v1/nodes/<node>/proxy) fails the check."""
    old = {
        "job_name": "kubelet-cadvisor",
        "kubernetes_sd_configs": [{"role": "node"}],
        "relabel_configs": [
            {"target_label": "__address__", "replacement": "kubernetes.default.svc:443"},
            {"source_labels": ["__meta_kubernetes_node_name"], "regex": "(.+)", "target_label": "__metrics_path__",
             "replacement": "/api/v1/nodes/$1/proxy/metrics/cadvisor"},
        ],
    }
    assert uses_api_server_as_proxy(old)
    assert uses_api_server_as_proxy({**old, "relabel_configs": old["relabel_configs"][:1]})
    assert uses_api_server_as_proxy({"job_name": "x", "static_configs": [{"targets": ["kubernetes.default.svc:443"]}]})


# --- shards and HA ------------------------------------------------------------------


def test_7500_nodes_make_eight_shards_each_keeping_its_hash(tmp_path):
    cluster = big(tmp_path)
    assert cluster.node_capacity == 7_500 + 8 + 200
    assert monitoring.shard_count(cluster) == 8
    files = configs(cluster)
    assert sorted(files) == ["prometheus-shard-%d.yml" % i for i in range(8)] + ["prometheus.yml"]
    for shard in range(8):
        for job in files[f"prometheus-shard-{shard}.yml"]["scrape_configs"]:
            hashmod, keep = job["relabel_configs"][:2]
            assert hashmod["action"] == "hashmod" and hashmod["modulus"] == 8
            assert hashmod["source_labels"][0] in ("__meta_kubernetes_node_name", "__meta_kubernetes_pod_node_name")
            assert keep == {"source_labels": [hashmod["target_label"]], "regex": str(shard), "action": "keep"}
    # Per-node targets only on the shards; cluster-wide ones only on the global server.
    global_jobs = {j["job_name"] for j in files["prometheus.yml"]["scrape_configs"]}
    # corral-repair: the GPU repair controller's metrics (corral/manifests/repair.py scrape_jobs).
    # kueue: Kueue's manager (scheduling.kueue, corral/manifests/kueue.py scrape_jobs).
    assert global_jobs == {"kube-state-metrics", "apiserver", "federate-shards", "etcd-members", "corral-repair",
                           "kueue"}
    federate = next(j for j in files["prometheus.yml"]["scrape_configs"] if j["job_name"] == "federate-shards")
    assert federate["static_configs"][0]["targets"] == [
        f"prometheus-shard-{i}.{NS}.svc:9090" for i in range(8)]


def test_shards_can_be_set_in_the_cluster_file(tmp_path):
    cluster = variant(tmp_path, "jaguar", ("nodePools:\n", "monitoring: {shards: 3}\n\nnodePools:\n"))
    objects = monitoring_objects(cluster)
    assert {k for k in objects if k.startswith("StatefulSet/")} == {
        "StatefulSet/prometheus-global", *(f"StatefulSet/prometheus-shard-{i}" for i in range(3))}


@pytest.mark.parametrize("name", NAMES)
def test_every_prometheus_is_an_ha_pair_on_persistent_volumes(name):
    cluster = FLEET.clusters[name]
    objects = monitoring_objects(cluster)
    statefulsets = [o for k, o in objects.items() if k.startswith("StatefulSet/prometheus")]
    assert len(statefulsets) == 1 + monitoring.shard_count(cluster)
    for sts in statefulsets:
        spec = sts["spec"]
        assert spec["replicas"] == 2
        pod = spec["template"]["spec"]
        assert not any("emptyDir" in v for v in pod["volumes"])
        (claim,) = spec["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert "storageClassName" not in claim["spec"]  # the cluster's default class
        args = pod["containers"][0]["args"]
        assert "--storage.tsdb.retention.time=15d" in args
        size = int(claim["spec"]["resources"]["requests"]["storage"].removesuffix("Gi"))
        retention_size = next(a for a in args if a.startswith("--storage.tsdb.retention.size="))
        assert int(retention_size.split("=")[1].removesuffix("GB")) <= size * 0.8
        anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
        assert objects[f"PodDisruptionBudget/{sts['metadata']['name']}"]["spec"]["maxUnavailable"] == 1
        # HA pairs tell their replicas apart in federation and remote storage.
        assert pod["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert "--enable-feature=expand-external-labels" in args


def test_retention_storage_class_and_remote_write_from_the_cluster_file(tmp_path):
    cluster = variant(tmp_path, "jaguar", ("nodePools:\n", (
        "monitoring:\n  retentionDays: 30\n  storageClass: fast-ssd\n"
        "  remoteWrite: {url: 'https://metrics.example.internal/api/v1/push', secret: {name: remote-write, key: token}}\n"
        "\nnodePools:\n")))
    before = FLEET.clusters["jaguar"]
    objects = monitoring_objects(cluster)
    sts = objects["StatefulSet/prometheus-shard-0"]
    pod = sts["spec"]["template"]["spec"]
    assert "--storage.tsdb.retention.time=30d" in pod["containers"][0]["args"]
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast-ssd"
    # Twice the retention, at least as much disk (powers of two).
    assert monitoring.shard_size(cluster).volume_gib >= 2 * monitoring.shard_size(before).volume_gib
    secret_volume = next(v for v in pod["volumes"] if v["name"] == "remote-write")
    assert secret_volume["secret"] == {"secretName": "remote-write", "items": [{"key": "token", "path": "token"}]}
    for config in configs(cluster).values():
        assert config["remote_write"] == [{
            "url": "https://metrics.example.internal/api/v1/push",
            "authorization": {"credentials_file": "/etc/prometheus/remote-write/token"}}]
    # corral never creates the Secret, so its value cannot be in any manifest.
    assert not any(o["kind"] == "Secret" for a in render(cluster) for o in a.objects)


def test_a_remote_write_url_with_credentials_is_refused(tmp_path):
    from corral.model.document import ValidationFailed

    with pytest.raises(ValidationFailed) as failed:
        variant(tmp_path, "jaguar", ("nodePools:\n",
                                     "monitoring: {remoteWrite: {url: 'https://user:pw@metrics.internal/push'}}\n\nnodePools:\n"))
    text = "\n".join(str(p) for p in failed.value.problems)
    assert "monitoring.remoteWrite.url" in text and "jaguar.yaml" in text


def test_growing_a_pool_a_little_restarts_no_prometheus(tmp_path):
    before = FLEET.clusters["jaguar"]
    after = variant(tmp_path, "jaguar", ("maxSize: 200", "maxSize: 300"))
    a, b = monitoring_objects(before), monitoring_objects(after)
    assert {k for k in a if a[k] != b.get(k)} == set()


def test_memory_and_disk_grow_with_the_shards_share(tmp_path):
    small = monitoring.shard_size(FLEET.clusters["jaguar"])
    large = monitoring.shard_size(big(tmp_path))
    assert large.nodes > small.nodes and large.memory_bytes > small.memory_bytes
    # At 7,500 nodes a shard stays within one ordinary machine (docs/monitoring.md).
    assert large.memory_bytes < 24 * 1024**3


# --- promtool -----------------------------------------------------------------------

SD_FIELDS = {"role", "namespaces", "selectors"}
SD_ROLES = {"node", "pod", "service", "endpoints", "endpointslice", "ingress"}


def for_debian_promtool(config: dict, folder: Path) -> dict:
    """The config with Kubernetes discovery as file discovery (Debian's Prometheus lacks
    it): job J reads `folder`/J.json (created empty if absent), and the in-cluster file
    paths under `folder`."""
    for job in config["scrape_configs"]:
        for sd in job.pop("kubernetes_sd_configs", []):
            assert set(sd) <= SD_FIELDS and sd["role"] in SD_ROLES, sd
            for selector in sd.get("selectors", []):
                assert selector["role"] == sd["role"] and set(selector) <= {"role", "label", "field"}
            targets = folder / f"{job['job_name']}.json"
            if not targets.exists():
                targets.write_text("[]")
            job.setdefault("file_sd_configs", []).append({"files": [str(targets)]})
    text = json.dumps(config)
    for path in ("/etc/prometheus/", "/var/run/secrets/kubernetes.io/serviceaccount/"):
        text = text.replace(path, f"{folder}/")
    return json.loads(text)


@needs_promtool
@pytest.mark.parametrize("name", NAMES + ["7500-nodes"])
def test_promtool_checks_every_rendered_config_and_rule_file(name, tmp_path):
    cluster = big(tmp_path) if name == "7500-nodes" else FLEET.clusters[name]
    files = prometheus_files(cluster)
    for credential in ("ca.crt", "token"):
        (tmp_path / credential).write_text("x")
    for key, text in files.items():
        data = yaml.safe_load(text)
        if key.startswith("prometheus"):
            data = for_debian_promtool(data, tmp_path)
        (tmp_path / key).write_text(yaml.safe_dump(data, sort_keys=False))
    for key in files:
        command = ["promtool", "check", "config" if key.startswith("prometheus") else "rules", key]
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (key, result.stdout + result.stderr)


RULE_TESTS = {
    "rule_files": ["shard.yml", "global.yml"],
    "evaluation_interval": "1m",
    "tests": [{
        "interval": "1m",
        "input_series": [
            # Two running pods of team a (one namespace each), one pending.
            {"series": 'kube_pod_container_resource_requests{namespace="a1",pod="p1",resource="nvidia_com_gpu",unit="integer"}',
             "values": "4x30"},
            {"series": 'kube_pod_container_resource_requests{namespace="a2",pod="p2",resource="nvidia_com_gpu",unit="integer"}',
             "values": "2x30"},
            {"series": 'kube_pod_container_resource_requests{namespace="a1",pod="p3",resource="nvidia_com_gpu",unit="integer"}',
             "values": "8x30"},
            {"series": 'kube_pod_status_phase{namespace="a1",pod="p1",phase="Running"}', "values": "1x30"},
            {"series": 'kube_pod_status_phase{namespace="a2",pod="p2",phase="Running"}', "values": "1x30"},
            {"series": 'kube_pod_status_phase{namespace="a1",pod="p3",phase="Running"}', "values": "0x30"},
            {"series": 'kube_pod_info{namespace="a1",pod="p1",node="n1"}', "values": "1x30"},
            {"series": 'kube_pod_info{namespace="a2",pod="p2",node="n2"}', "values": "1x30"},
            {"series": 'kube_namespace_labels{namespace="a1",label_corral_dev_team="a"}', "values": "1x30"},
            {"series": 'kube_namespace_labels{namespace="a2",label_corral_dev_team="a"}', "values": "1x30"},
            # n1 is team a's reserved node; n2 is shared.
            {"series": 'kube_node_labels{node="n1",label_corral_dev_team="a"}', "values": "1x30"},
            {"series": 'kube_node_labels{node="n2"}', "values": "1x30"},
            {"series": 'kube_node_status_allocatable{node="n1",resource="nvidia_com_gpu",unit="integer"}',
             "values": "8x30"},
            {"series": 'kube_node_status_allocatable{node="n2",resource="nvidia_com_gpu",unit="integer"}',
             "values": "8x30"},
            # dcgm-exporter: p1's four GPUs at 50%, p2's two at 100%, an idle unallocated one.
            *({"series": f'DCGM_FI_DEV_GPU_UTIL{{node="n1",gpu="{g}",namespace="a1",pod="p1"}}', "values": "50x30"}
              for g in range(4)),
            *({"series": f'DCGM_FI_DEV_GPU_UTIL{{node="n2",gpu="{g}",namespace="a2",pod="p2"}}', "values": "100x30"}
              for g in range(2)),
            {"series": 'DCGM_FI_DEV_GPU_UTIL{node="n1",gpu="7"}', "values": "0x30"},
        ],
        "promql_expr_test": [
            {"expr": 'namespace:kube_pod_container_resource_requests:sum{resource="nvidia_com_gpu"}', "eval_time": "10m",
             "exp_samples": [
                 {"labels": 'namespace:kube_pod_container_resource_requests:sum{namespace="a1",resource="nvidia_com_gpu",unit="integer"}', "value": 4},
                 {"labels": 'namespace:kube_pod_container_resource_requests:sum{namespace="a2",resource="nvidia_com_gpu",unit="integer"}', "value": 2}]},
            {"expr": "namespace:dcgm_gpus_busy:sum", "eval_time": "10m", "exp_samples": [
                {"labels": 'namespace:dcgm_gpus_busy:sum{namespace="a1"}', "value": 2},
                {"labels": 'namespace:dcgm_gpus_busy:sum{namespace="a2"}', "value": 2}]},
            {"expr": "node:dcgm_gpu_utilisation:avg", "eval_time": "10m", "exp_samples": [
                {"labels": 'node:dcgm_gpu_utilisation:avg{node="n1"}', "value": 40},
                {"labels": 'node:dcgm_gpu_utilisation:avg{node="n2"}', "value": 100}]},
            {"expr": "team:corral_reserved_gpus:sum", "eval_time": "10m", "exp_samples": [
                {"labels": 'team:corral_reserved_gpus:sum{label_corral_dev_team="a"}', "value": 8}]},
            {"expr": "team:corral_reserved_gpus_requested:sum", "eval_time": "10m", "exp_samples": [
                {"labels": 'team:corral_reserved_gpus_requested:sum{label_corral_dev_team="a"}', "value": 4}]},
            {"expr": 'team:kube_pod_container_resource_requests:sum{resource="nvidia_com_gpu"}', "eval_time": "10m",
             "exp_samples": [{"labels": 'team:kube_pod_container_resource_requests:sum{label_corral_dev_team="a",resource="nvidia_com_gpu",unit="integer"}', "value": 6}]},
            {"expr": "team:corral_gpus_busy:sum", "eval_time": "10m", "exp_samples": [
                {"labels": 'team:corral_gpus_busy:sum{label_corral_dev_team="a"}', "value": 4}]},
            {"expr": "team:corral_gpu_utilisation:ratio", "eval_time": "10m", "exp_samples": [
                {"labels": 'team:corral_gpu_utilisation:ratio{label_corral_dev_team="a"}', "value": 4 / 6}]},
        ],
    }],
}


@needs_promtool
def test_promtool_unit_tests_the_recording_rules(tmp_path):
    """On one server: the shard's records feed the global ones (by federation in a cluster)."""
    (tmp_path / "shard.yml").write_text(monitoring.prometheus_rules(monitoring.shard_rule_groups(True)))
    (tmp_path / "global.yml").write_text(monitoring.prometheus_rules(monitoring.global_rule_groups(True)))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(RULE_TESTS, sort_keys=False))
    result = subprocess.run(["promtool", "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# --- Grafana ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_grafana_is_provisioned_with_the_dashboards_and_no_anonymous_viewer(name):
    cluster = FLEET.clusters[name]
    objects = monitoring_objects(cluster)
    sources = yaml.safe_load(objects["ConfigMap/grafana-datasources"]["data"]["datasources.yaml"])["datasources"]
    assert [s["url"] for s in sources if s["isDefault"]] == [f"http://prometheus.{NS}.svc:9090"]
    assert len(sources) == 1 + monitoring.shard_count(cluster)
    boards = {k: o for k, o in objects.items() if k.startswith("ConfigMap/grafana-dashboard-corral")}
    assert set(boards) == {"ConfigMap/grafana-dashboard-corral-control-plane", "ConfigMap/grafana-dashboard-corral-teams",
                           "ConfigMap/grafana-dashboard-corral-gpu-fleet"}
    for obj in boards.values():
        (text,) = obj["data"].values()
        board = json.loads(text)
        assert board["panels"] and all(p["targets"] for p in board["panels"])
    deployment = objects["Deployment/grafana"]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in deployment["containers"][0]["env"]}
    # Everyone logs in (the admin from Secret grafana-admin, tests/infra/test_grafana_admin.py):
    # no anonymous Viewer, the login form on, no admin password in the manifest.
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env and env.get("GF_AUTH_DISABLE_LOGIN_FORM", "false") == "false"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env and env["GF_SECURITY_ADMIN_PASSWORD__FILE"].startswith("/")
    assert deployment["automountServiceAccountToken"] is False
    mounts = {m["mountPath"] for m in deployment["containers"][0]["volumeMounts"]}
    assert {f"/var/lib/grafana-dashboards/{b}" for b in ("corral-control-plane", "corral-teams", "corral-gpu-fleet")} <= mounts


def test_gpu_dashboard_follows_the_health_agent():
    from corral.health.classify import FAULT_CONDITIONS
    from corral.model.schema import PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY

    text = " ".join(dashboards.queries(dashboards.gpu_fleet()))
    for needle in (*FAULT_CONDITIONS, PREFLIGHT_TAINT_KEY, UNHEALTHY_TAINT_KEY, "DCGM_FI_DEV_XID_ERRORS",
                   "pool:corral_gpu_nodes_unhealthy:ratio"):
        assert needle in text, needle
    control = " ".join(dashboards.queries(dashboards.control_plane()))
    assert "etcd_request_duration_seconds_bucket" in control and "apiserver_request_duration_seconds_bucket" in control


def test_kube_state_metrics_is_sharded_at_7500_nodes(tmp_path):
    cluster = big(tmp_path)
    objects = monitoring_objects(cluster)
    assert monitoring.ksm_shard_count(cluster) == 4
    deployments = {k: o for k, o in objects.items() if k.startswith("Deployment/kube-state-metrics")}
    assert sorted(deployments) == [f"Deployment/kube-state-metrics-shard-{i}" for i in range(4)]
    selectors = []
    for i in range(4):
        spec = deployments[f"Deployment/kube-state-metrics-shard-{i}"]["spec"]
        args = spec["template"]["spec"]["containers"][0]["args"]
        assert args[-2:] == [f"--shard={i}", "--total-shards=4"]
        selectors.append(tuple(sorted(spec["selector"]["matchLabels"].items())))
        service = objects[f"Service/kube-state-metrics-shard-{i}"]
        assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert len(set(selectors)) == 4  # no Deployment adopts another shard's pod
    assert "Service/kube-state-metrics" not in objects
    ksm_job = next(j for j in configs(cluster)["prometheus.yml"]["scrape_configs"] if j["job_name"] == "kube-state-metrics")
    assert ksm_job["static_configs"][0]["targets"] == [
        f"kube-state-metrics-shard-{i}.{NS}.svc:8080" for i in range(4)]
    # The example clusters keep the one unsharded instance.
    small = monitoring_objects(FLEET.clusters["jaguar"])
    assert "Deployment/kube-state-metrics" in small and "--total-shards=1" not in json.dumps(small)
