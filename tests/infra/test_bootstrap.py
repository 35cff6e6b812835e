"""Cloud-init documents: rendered, parsed back, and their configs checked flag by flag."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess

import pytest
import yaml

from corral.machine.api_server import (
    AUDIT_POLICY,
    ENCRYPTION_CONFIG,
    ControlPlaneTls,
    api_server_secret_files,
    render_kubeadm_init_config,
)
from corral.machine.cert_expiry import ENABLE_COMMAND as CERT_METRICS_ENABLE
from corral.machine.serving_csr import ENABLE_COMMAND as SERVING_CSR_ENABLE
from corral.machine.cloud_init import render_api_server_cloud_init, render_etcd_cloud_init, render_pool_cloud_init
from corral.machine.data_disk import AWS_ETCD_VOLUME_TAG, AZURE_ETCD_DEVICE, GCP_ETCD_DEVICE_NAME
from corral.machine.etcd_member import EtcdMemberTls, etcd_secret_files
from corral.machine.files import bundle, unbundle
from corral.machine.kubeadm import (
    CA_HASH_FILE,
    CA_HASH_PLACEHOLDER,
    NODE_NAME_PLACEHOLDER,
    TOKEN_FILE,
    TOKEN_PLACEHOLDER,
    JoinToken,
)
from corral.machine.metadata_block import BLOCK_POD_METADATA_SCRIPT, BLOCK_POD_METADATA_UNIT
from corral.machine.pool_node import pool_secret_files
from corral.machine.scheduler import render_scheduler_config
from corral.machine.secret_fetch import SecretRef
from corral.model import load_fleet
from corral.model.layout import layout

from .conftest import EXAMPLES

TOKEN = "abcdef.0123456789abcdef"
POOL_TOKEN = "pooltk.0123456789poolxx"
DIGEST = "sha256:" + "ab" * 32
ENCRYPTION_KEY = "c2VjcmV0Ym94LWtleS0zMi1ieXRlcy1sb25nLi4uLi4="
REF = SecretRef("aws", "us-west-2", "corral/test/role")
FETCH = "/usr/local/sbin/corral-fetch-secrets"


def pem(kind: str, label: str) -> str:
    return f"-----BEGIN {kind}-----\n{label}\n-----END {kind}-----\n"


ETCD_TLS = EtcdMemberTls(
    pem("CERTIFICATE", "etcd-ca"), pem("CERTIFICATE", "server"), pem("RSA PRIVATE KEY", "server-key"),
    pem("CERTIFICATE", "peer"), pem("RSA PRIVATE KEY", "peer-key"),
)
CP_TLS = ControlPlaneTls(
    pem("CERTIFICATE", "k8s-ca"), pem("RSA PRIVATE KEY", "k8s-ca-key"),
    pem("CERTIFICATE", "fp-ca"), pem("RSA PRIVATE KEY", "fp-ca-key"),
    pem("RSA PRIVATE KEY", "sa-key"), pem("PUBLIC KEY", "sa-pub"),
    pem("CERTIFICATE", "etcd-ca"), pem("CERTIFICATE", "etcd-client"), pem("RSA PRIVATE KEY", "etcd-client-key"),
)


def example(name: str):
    return load_fleet([EXAMPLES]).clusters[name]


def cloud_config(text: str) -> tuple[dict[str, dict], list[str]]:
    """write_files by path, and the commands, of a cloud-init document.

    runcmd is one shell script: `set -e` first, so the first failing command
    ends it non-zero and cloud-init reports the boot failed.
    """
    assert text.startswith("#cloud-config\n")
    document = yaml.safe_load(text)
    assert document["runcmd"][0] == "set -e"
    return {f["path"]: f for f in document["write_files"]}, document["runcmd"][1:]


def secret(files) -> dict[str, dict]:
    """A secret bundle's files in cloud_config's shape (path -> content, permissions), packed and unpacked."""
    unpacked = unbundle(bundle(files))
    return {path: {"content": f.content, "permissions": f.mode} for path, f in unpacked.items()}


def etcd_member(cluster, member, members, tls=None, events=False):
    """The member's user data files and commands, and its secret's files."""
    files, commands = cloud_config(render_etcd_cloud_init(cluster, member, members, REF, events))
    return files, commands, secret(etcd_secret_files(tls or ETCD_TLS))


def docs(text: str) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(text) if d}


def extra_args(section: dict, key: str = "extraArgs") -> dict[str, str]:
    """kubeadm extraArgs (or kubeletExtraArgs) as a map, from v1beta4's list or v1beta3's map."""
    args = section[key]
    return {a["name"]: a["value"] for a in args} if isinstance(args, list) else dict(args)


# --- etcd -----------------------------------------------------------------------


def test_etcd_member_config(cluster_variant):
    jaguar = cluster_variant("jaguar", {"members: 5 ": "members: 5\n    quotaBackendGiB: 6 "})
    lay = layout(jaguar)
    member = lay.etcd_members[2]
    files, commands, keys = etcd_member(jaguar, member, lay.etcd_members)
    config = yaml.safe_load(files["/etc/etcd/etcd.conf.yaml"]["content"])
    assert config["name"] == "jaguar-etcd-2"
    assert config["data-dir"] == "/var/lib/etcd"
    assert config["initial-cluster"] == ",".join(f"{m.name}=https://{m.ip}:2380" for m in lay.etcd_members)
    assert config["initial-cluster-token"] == "jaguar-etcd"
    assert config["quota-backend-bytes"] == 6 * 1024**3
    assert config["listen-peer-urls"] == f"https://{member.ip}:2380"
    assert config["advertise-client-urls"] == f"https://{member.ip}:2379"
    for section in ("client-transport-security", "peer-transport-security"):
        assert config[section]["client-cert-auth"] is True
        assert config[section]["trusted-ca-file"] == "/etc/etcd/pki/ca.crt"
    assert keys["/etc/etcd/pki/server.key"]["permissions"] == "0600"
    assert keys["/etc/etcd/pki/peer.key"]["content"] == ETCD_TLS.peer_key
    assert not any(path.startswith("/etc/etcd/pki/") for path in files)  # keys never in user data
    unit = files["/etc/systemd/system/etcd.service"]["content"]
    assert "RequiresMountsFor=/var/lib/etcd" in unit and "--config-file /etc/etcd/etcd.conf.yaml" in unit
    assert commands == [FETCH, "/usr/local/sbin/corral-etcd-data-disk", "/usr/local/sbin/corral-install-etcd",
                        CERT_METRICS_ENABLE,
                        "systemctl daemon-reload && systemctl enable --now corral-etcd-snapshot.timer",
                        "/usr/local/sbin/corral-install-node-exporter"]


def test_events_members_are_their_own_etcd_cluster(cluster_variant):
    jaguar = cluster_variant("jaguar", {"members: 5 ": "members: 5\n    dedicatedEventsCluster: true "})
    lay = layout(jaguar)
    files, _, _ = etcd_member(jaguar, lay.events_members[0], lay.events_members, events=True)
    config = yaml.safe_load(files["/etc/etcd/etcd.conf.yaml"]["content"])
    assert config["initial-cluster-token"] == "jaguar-etcd-events"
    assert "jaguar-etcd-0=" not in config["initial-cluster"]
    assert config["initial-cluster"].count("jaguar-etcd-events-") == 5


@pytest.mark.parametrize("name, device", [
    ("jaguar", "DEVICE=/dev/disk/azure/scsi1/lun0"),
    ("heron", "DEVICE=/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${VOLUME//-/}"),
    ("ibis", "DEVICE=/dev/disk/by-id/google-etcd-data"),
])
def test_data_disk_found_by_stable_path_and_never_reformatted(name, device):
    cluster = example(name)
    lay = layout(cluster)
    files, _, _ = etcd_member(cluster, lay.etcd_members[0], lay.etcd_members)
    script = files["/usr/local/sbin/corral-etcd-data-disk"]["content"]
    assert device in script
    # mkfs only when blkid finds no filesystem; fstab by UUID, mounted at /var/lib/etcd.
    assert script.index("if ! blkid -p") < script.index("mkfs.ext4")
    assert 'UUID=$UUID /var/lib/etcd ext4' in script


def test_disk_paths_match_the_cloud_packages():
    """The bootstrap and each cloud package must agree on where the etcd disk appears."""
    azure = importlib.import_module("corral.infra.azure.common")
    assert azure.ETCD_DISK_DEVICE == AZURE_ETCD_DEVICE
    aws = importlib.import_module("corral.infra.aws.etcd")
    assert aws.VOLUME_TAG == AWS_ETCD_VOLUME_TAG
    gcp = importlib.import_module("corral.infra.gcp.etcd")
    assert gcp.ETCD_DEVICE_NAME == GCP_ETCD_DEVICE_NAME


# --- API servers ----------------------------------------------------------------------


TOKENS = [JoinToken(TOKEN, "API servers"), JoinToken(POOL_TOKEN, "a pool")]
INIT_TOKEN = "inittk.0123456789initxx"


def api_server(cluster, index: int = 0, with_secret: bool = True):
    """API server `index`'s user data files (and, merged in, the API servers' secret's files), commands."""
    lay = layout(cluster)
    files, commands = cloud_config(render_api_server_cloud_init(cluster, lay, index, REF))
    if with_secret:
        keys = secret(api_server_secret_files(cluster, lay, CP_TLS, TOKEN, INIT_TOKEN, DIGEST, ENCRYPTION_KEY))
        assert not set(keys) & set(files)
        files = {**files, **keys}
    return lay, files, commands


def test_first_api_server_inits_with_external_etcd_and_large_cluster_flags():
    jaguar = example("jaguar")  # Kubernetes 1.36: kubeadm v1beta4
    lay, files, commands = api_server(jaguar, 0)
    kubeadm = docs(files["/etc/kubernetes/kubeadm/init.yaml"]["content"])
    assert files["/etc/kubernetes/kubeadm/init.yaml"]["permissions"] == "0600"
    init = kubeadm["InitConfiguration"]
    assert init["apiVersion"] == "kubeadm.k8s.io/v1beta4"
    # kubeadm init registers its own short-lived token only; machines join with
    # tokens Pulumi registers (addons), the API servers' from their secret.
    assert [(t["token"], t["ttl"]) for t in init["bootstrapTokens"]] == [(INIT_TOKEN, "1h0m0s")]
    assert files[TOKEN_FILE] == {"content": TOKEN + "\n", "permissions": "0600"}
    assert init["localAPIEndpoint"]["advertiseAddress"] == lay.api_servers[0].ip
    cluster_config = kubeadm["ClusterConfiguration"]
    assert cluster_config["controlPlaneEndpoint"] == lay.api_endpoint
    assert cluster_config["kubernetesVersion"] == "v1.36.4"
    assert cluster_config["networking"] == {"podSubnet": "10.128.0.0/14", "serviceSubnet": "10.96.0.0/16"}
    external = cluster_config["etcd"]["external"]
    assert external["endpoints"] == [f"https://{m.ip}:2379" for m in lay.etcd_members]
    args = extra_args(cluster_config["apiServer"])
    plugins = args["enable-admission-plugins"].split(",")
    assert {"NodeRestriction", "PodTolerationRestriction", "ExtendedResourceToleration"} <= set(plugins)
    assert "etcd-servers-overrides" not in args  # no dedicated events cluster
    assert extra_args(cluster_config["scheduler"]) == {"config": "/etc/kubernetes/scheduler-config.yaml"}
    kubelet = kubeadm["KubeletConfiguration"]
    assert kubelet["serializeImagePulls"] is False
    assert kubelet["cgroupDriver"] == "systemd"
    script = files["/usr/local/sbin/corral-api-server"]["content"]
    # Initialise only when no peer is up; a replacement first server joins instead.
    init_at = script.index("init --config /etc/kubernetes/kubeadm/init.yaml")
    join_at = script.index('join --config "$JOIN_CONFIG"')
    assert script.index('if [ -z "$ENDPOINT" ]') < init_at < script.index("exit 0") < join_at
    assert docs(files["/etc/kubernetes/kubeadm/join.yaml"]["content"])["JoinConfiguration"]["controlPlane"]
    # Then the hourly certificate expiry metrics (corral/machine/cert_expiry.py, tests/certs/test_machine_metrics.py)
    # and the approval of its own kubelet serving certificate (tests/certs/test_own_serving_csr.py).
    # The machine's kubelet reservations are sized before kubeadm (tests/infra/test_kubelet_reservations.py).
    assert commands == [FETCH, "/usr/local/sbin/corral-kubelet-reservations", "/usr/local/sbin/corral-api-server",
                        CERT_METRICS_ENABLE, SERVING_CSR_ENABLE]


def test_pre_issued_keys_go_to_kubeadms_pki_dir():
    _, files, _ = api_server(example("heron"))
    pki = "/etc/kubernetes/pki"
    expected = {
        "ca.crt": CP_TLS.ca_cert, "ca.key": CP_TLS.ca_key, "front-proxy-ca.crt": CP_TLS.front_proxy_ca_cert,
        "front-proxy-ca.key": CP_TLS.front_proxy_ca_key, "sa.key": CP_TLS.service_account_key,
        "sa.pub": CP_TLS.service_account_public_key, "etcd/ca.crt": CP_TLS.etcd_ca_cert,
        "apiserver-etcd-client.crt": CP_TLS.etcd_client_cert, "apiserver-etcd-client.key": CP_TLS.etcd_client_key,
    }
    for name, content in expected.items():
        assert files[f"{pki}/{name}"]["content"] == content
        assert files[f"{pki}/{name}"]["permissions"] == ("0600" if name.endswith(".key") else "0644")


def test_events_override_points_at_the_events_members(cluster_variant):
    jaguar = cluster_variant("jaguar", {"members: 5 ": "members: 5\n    dedicatedEventsCluster: true "})
    lay, files, _ = api_server(jaguar)
    cluster_config = docs(files["/etc/kubernetes/kubeadm/init.yaml"]["content"])["ClusterConfiguration"]
    override = extra_args(cluster_config["apiServer"])["etcd-servers-overrides"]
    assert override == "/events#" + ";".join(f"https://{m.ip}:2379" for m in lay.events_members)


# The older rows' kubeadm config API: heron moved back to 1.30 (kubeadm v1beta3), for the clusters
# still on it until they upgrade (loading does not judge end of life; `corral validate` does).
ON_1_30 = {'version: "1.35.9"': 'version: "1.30.8"'}
# Coscheduling: jaguar on 1.31, the last minors scheduler-plugins released for (refused from 1.35).
COSCHEDULING_ON_1_31 = {'version: "1.36.4"': 'version: "1.31.4"',
                        "  binPacking: true\n": "  binPacking: true\n  coscheduling: true\n"}


def test_other_api_servers_join_the_control_plane(cluster_variant):
    heron = cluster_variant("heron", ON_1_30)  # Kubernetes 1.30: kubeadm v1beta3
    lay, files, _ = api_server(heron, 2, with_secret=False)
    assert "/etc/kubernetes/kubeadm/init.yaml" not in files
    join = docs(files["/etc/kubernetes/kubeadm/join.yaml"]["content"])
    assert set(join) == {"JoinConfiguration"}
    config = join["JoinConfiguration"]
    assert config["apiVersion"] == "kubeadm.k8s.io/v1beta3"
    assert config["controlPlane"]["localAPIEndpoint"]["advertiseAddress"] == lay.api_servers[2].ip
    # The token and the CA pin are filled in at boot from the fetched secret.
    assert config["discovery"]["bootstrapToken"]["token"] == TOKEN_PLACEHOLDER
    assert config["discovery"]["bootstrapToken"]["caCertHashes"] == [CA_HASH_PLACEHOLDER]
    script = files["/usr/local/sbin/corral-api-server"]["content"]
    assert 'join --config "$JOIN_CONFIG"' in script and "init --config" not in script
    assert f"$(cat {TOKEN_FILE})" in script and f"$(cat {CA_HASH_FILE})" in script
    # Discovery through any peer already up, never through itself.
    peers = script.split("for ip in ")[1].split(";")[0].split()
    assert peers == [lay.api_servers[0].ip, lay.api_servers[1].ip]


def test_v1beta3_extra_args_are_a_map(cluster_variant):
    _, files, _ = api_server(cluster_variant("heron", ON_1_30), 0)
    cluster_config = docs(files["/etc/kubernetes/kubeadm/init.yaml"]["content"])["ClusterConfiguration"]
    assert isinstance(cluster_config["apiServer"]["extraArgs"], dict)


# --- Scheduler -------------------------------------------------------------------------


def profile(text: str) -> dict:
    config = yaml.safe_load(text)
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (only,) = config["profiles"]
    return only


def plugin_args(profile_: dict, name: str) -> dict | None:
    return next((p["args"] for p in profile_.get("pluginConfig", []) if p["name"] == name), None)


def test_bin_packing_is_most_allocated_with_gpus_weighted(cluster_variant):
    ibis = example("ibis")  # binPacking, no coscheduling
    only = profile(render_scheduler_config(ibis))
    strategy = plugin_args(only, "NodeResourcesFit")["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights["nvidia.com/gpu"] > weights["cpu"] == weights["memory"] == 1
    assert {"name": "NodeResourcesBalancedAllocation"} in only["plugins"]["score"]["disabled"]
    assert plugin_args(only, "Coscheduling") is None and "queueSort" not in only["plugins"]


def test_no_bin_packing_leaves_the_default_scoring(cluster_variant):
    ibis = cluster_variant("ibis", {"binPacking: true": "binPacking: false"})
    only = profile(render_scheduler_config(ibis))
    assert plugin_args(only, "NodeResourcesFit") is None and "plugins" not in only


def test_coscheduling_profile_and_scheduler_image(cluster_variant):
    jaguar = cluster_variant("jaguar", COSCHEDULING_ON_1_31)  # binPacking and coscheduling
    only = profile(render_scheduler_config(jaguar))
    for point in ("queueSort", "preFilter", "postFilter", "permit", "reserve"):
        assert {"name": "Coscheduling"} in only["plugins"][point]["enabled"]
    assert plugin_args(only, "Coscheduling")["permitWaitingTimeSeconds"] > 0
    assert plugin_args(only, "NodeResourcesFit")["scoringStrategy"]["type"] == "MostAllocated"
    _, files, _ = api_server(jaguar)
    patch = yaml.safe_load(files["/etc/kubernetes/patches/kube-scheduler+strategic.yaml"]["content"])
    assert patch["spec"]["containers"][0]["image"].startswith("registry.k8s.io/scheduler-plugins/kube-scheduler:v0.31.")
    init = docs(files["/etc/kubernetes/kubeadm/init.yaml"]["content"])["InitConfiguration"]
    assert init["patches"] == {"directory": "/etc/kubernetes/patches"}
    assert files["/etc/kubernetes/scheduler-config.yaml"]["content"] == render_scheduler_config(jaguar)


def test_coscheduling_on_an_unknown_minor_is_a_clear_error(cluster_variant):
    jaguar = cluster_variant("jaguar", {**COSCHEDULING_ON_1_31, 'version: "1.36.4"': 'version: "1.32.3"'})
    with pytest.raises(ValueError, match="scheduler-plugins release for Kubernetes 1.32"):
        render_scheduler_config(jaguar)


# --- Cloud pool nodes --------------------------------------------------------------------


def test_pool_nodes_join_with_the_shared_template_and_their_labels_and_taints():
    heron = example("heron")
    lay = layout(heron)
    pool = heron.pool("gpu-a10g-inference")
    files, commands = cloud_config(render_pool_cloud_init(heron, lay, pool, REF))
    join_file = files["/etc/kubernetes/kubeadm/join.yaml"]
    assert join_file["permissions"] == "0600"
    assert "join-configuration.yaml.j2" in join_file["content"]  # the shared template's banner
    join = yaml.safe_load(join_file["content"])
    assert join["kind"] == "JoinConfiguration"
    discovery = join["discovery"]["bootstrapToken"]
    assert discovery == {
        "apiServerEndpoint": lay.api_endpoint,
        "token": TOKEN_PLACEHOLDER, "caCertHashes": [CA_HASH_PLACEHOLDER],
    }
    # What the placeholders are filled from: the pool's own secret.
    keys = secret(pool_secret_files(POOL_TOKEN, DIGEST))
    assert keys == {
        TOKEN_FILE: {"content": POOL_TOKEN + "\n", "permissions": "0600"},
        CA_HASH_FILE: {"content": DIGEST + "\n", "permissions": "0600"},
    }
    registration = join["nodeRegistration"]
    assert registration["name"] == NODE_NAME_PLACEHOLDER
    labels = dict(item.split("=", 1) for item in extra_args(registration, "kubeletExtraArgs")["node-labels"].split(","))
    # + the GPU pool's template fingerprint (corral upgrade replaces nodes of an older one)
    from corral.machine.rollout import TEMPLATE_LABEL, pool_template_fingerprint

    assert labels == heron.node_labels(pool) | {TEMPLATE_LABEL: pool_template_fingerprint(heron, pool)}
    assert labels["corral.dev/team"] == "inference"
    taints = {(t["key"], t.get("value"), t["effect"]) for t in registration["taints"]}
    assert ("corral.dev/team", "inference", "NoSchedule") in taints
    assert ("nvidia.com/gpu", "present", "NoSchedule") in taints
    script = files["/usr/local/sbin/corral-pool-node"]["content"]
    assert NODE_NAME_PLACEHOLDER in script and 'join --config "$JOIN_CONFIG"' in script
    # The token and everything holding it leave the disk when the script ends.
    assert f'trap \'rm -f "$JOIN_CONFIG" {TOKEN_FILE}' in script
    assert commands == [FETCH, "/usr/local/sbin/corral-kubelet-reservations", "/usr/local/sbin/corral-topology-labels",
                        "/usr/local/sbin/corral-pool-node"]


def test_pods_cannot_reach_the_instance_metadata_service():
    """Every kubelet machine drops pod-network traffic to 169.254.169.254 (the
    metadata service on every cloud: identity tokens that read its secret)."""
    ibis = example("ibis")
    lay = layout(ibis)
    for document in (render_api_server_cloud_init(ibis, lay, 0, REF), render_pool_cloud_init(ibis, lay, ibis.cloud_pools[0], REF)):
        files, _ = cloud_config(document)
        script = files[BLOCK_POD_METADATA_SCRIPT]["content"]
        assert f"PREROUTING -s {ibis.kubernetes.pod_cidr} -d 169.254.169.254/32" in script and "-j DROP)" in script
        assert "iptables -t raw -C" in script  # idempotent: checked before inserted
        unit = files[f"/etc/systemd/system/{BLOCK_POD_METADATA_UNIT}"]["content"]
        assert "Before=kubelet.service" in unit and "ExecStart=/usr/local/sbin/corral-block-pod-metadata" in unit
        prep = files["/usr/local/sbin/corral-node-prep"]["content"]
        assert prep.index(f"systemctl enable --now {BLOCK_POD_METADATA_UNIT}") < prep.index("systemctl enable kubelet")


def test_azure_pods_cannot_reach_the_wireserver_agent_ports_but_keep_its_dns():
    """Azure's WireServer (168.63.129.16) serves the VM agent on 80 and 32526 and the VNet's DNS on
    53: pods lose the first two (issue 25, item 11), keep DNS; other clouds have no such rule."""
    jaguar, ibis = example("jaguar"), example("ibis")
    files, _ = cloud_config(render_pool_cloud_init(jaguar, layout(jaguar), jaguar.pool("cpu-d64"), REF))
    script = files[BLOCK_POD_METADATA_SCRIPT]["content"]
    pods = jaguar.kubernetes.pod_cidr
    for port in (80, 32526):
        assert f"PREROUTING -s {pods} -d 168.63.129.16/32 -p tcp --dport {port} " in script
    assert script.count("-d 168.63.129.16/32") == 2  # no rule for the whole address: DNS (53) stays
    files, _ = cloud_config(render_pool_cloud_init(ibis, layout(ibis), ibis.cloud_pools[0], REF))
    assert "168.63.129.16" not in files[BLOCK_POD_METADATA_SCRIPT]["content"]


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None or shutil.which("unshare") is None,
                    reason="runs the rule script in a network namespace of its own: root, iptables, unshare")
def test_the_rule_script_sets_its_rules_once_in_a_real_network_namespace(tmp_path):
    jaguar = example("jaguar")
    files, _ = cloud_config(render_pool_cloud_init(jaguar, layout(jaguar), jaguar.pool("cpu-d64"), REF))
    script = tmp_path / "block"
    script.write_text(files[BLOCK_POD_METADATA_SCRIPT]["content"])
    # twice (every boot runs it), then what the kernel holds: a namespace of its own, nothing of the machine's
    result = subprocess.run(["unshare", "--net", "bash", "-c", f"bash {script} && bash {script} && iptables -t raw -S PREROUTING"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rules = [line for line in result.stdout.splitlines() if line.startswith("-A PREROUTING")]
    assert len(rules) == 3, rules
    assert any("-d 169.254.169.254/32" in r and "--dport" not in r for r in rules)
    assert sorted(int(r.split("--dport ")[1].split()[0]) for r in rules if "168.63.129.16" in r) == [80, 32526]


def test_nodes_get_the_clusters_arp_thresholds_and_pinned_kubernetes():
    jaguar = example("jaguar")
    files, _ = cloud_config(render_pool_cloud_init(jaguar, layout(jaguar), jaguar.pool("cpu-d64"), REF))
    sysctl = files["/etc/sysctl.d/90-corral.conf"]["content"]
    # The cluster model's sizes, the same the on-prem inventory carries (one source).
    arp = jaguar.network.arp_cache
    for i, value in ((1, arp.gc_thresh1), (2, arp.gc_thresh2), (3, arp.gc_thresh3)):
        assert f"net.ipv4.neigh.default.gc_thresh{i} = {value}\n" in sysctl
    prep = files["/usr/local/sbin/corral-node-prep"]["content"]
    assert "kubeadm=1.36.4-1.1" in prep and "core:/stable:/v1.36/deb/" in prep
    assert "apt-mark hold containerd.io kubelet kubeadm kubectl" in prep


def test_cloud_init_stays_valid_yaml_with_awkward_values(cluster_variant):
    """Quotes, colons and '#' in file contents survive the round trip (every scalar is JSON-quoted)."""
    heron = example("heron")
    lay = layout(heron)
    awkward = EtcdMemberTls(*(['a: "b" # c\n  - d: {e}\n'] * 5))
    _, _, keys = etcd_member(heron, lay.etcd_members[0], lay.etcd_members, awkward)
    assert keys["/etc/etcd/pki/server.key"]["content"] == 'a: "b" # c\n  - d: {e}\n'


@pytest.mark.parametrize("name", ["jaguar", "heron", "ibis"])
def test_every_boot_script_is_valid_bash(name, tmp_path):
    import subprocess

    cluster = example(name)
    lay = layout(cluster)
    ref = SecretRef(cluster.control_plane.cloud, "store", f"{name}-role")
    documents = [
        render_etcd_cloud_init(cluster, lay.etcd_members[0], lay.etcd_members, ref),
        render_api_server_cloud_init(cluster, lay, 0, ref),
        render_api_server_cloud_init(cluster, lay, 1, ref),
        render_pool_cloud_init(cluster, lay, cluster.cloud_pools[0], ref),
    ]
    scripts = [
        (path, file["content"])
        for document in documents
        for path, file in cloud_config(document)[0].items()
        if file["content"].startswith("#!/bin/bash")
    ]
    # Every machine: fetch-secrets; etcd: data disk + install etcd + snapshot job + install
    # node_exporter + certificate expiry metrics; per API server:
    # node-prep, provider ID, pod metadata block, kubelet reservations, hairpin, its script,
    # certificate expiry metrics, approval of its own serving certificate (on AWS also the
    # API load balancer's DNS name); pool: node-prep, provider ID, metadata block,
    # kubelet reservations, its script.
    per_api_server = 1 + (9 if cluster.control_plane.cloud == "aws" else 8)
    assert len(scripts) == (1 + 5) + 2 * per_api_server + (1 + 5)
    for number, (path, text) in enumerate(scripts):
        script = tmp_path / f"{number}.sh"
        script.write_text(text)
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{path}: {result.stderr}"


# --- Audit log, Secrets encryption, token lifetime ------------------------------------------


def test_api_servers_audit_and_encrypt_secrets():
    jaguar = example("jaguar")
    lay, files, _ = api_server(jaguar, 0)
    cluster_config = docs(files["/etc/kubernetes/kubeadm/init.yaml"]["content"])["ClusterConfiguration"]
    args = extra_args(cluster_config["apiServer"])
    assert args["audit-policy-file"] == AUDIT_POLICY
    assert args["audit-log-path"] == "/var/log/kubernetes/audit/audit.log"
    assert (args["audit-log-maxage"], args["audit-log-maxbackup"], args["audit-log-maxsize"]) == ("30", "10", "100")
    assert args["encryption-provider-config"] == ENCRYPTION_CONFIG
    volumes = {v["name"]: v for v in cluster_config["apiServer"]["extraVolumes"]}
    assert volumes["audit-policy"] == {"name": "audit-policy", "hostPath": AUDIT_POLICY,
                                       "mountPath": AUDIT_POLICY, "readOnly": True, "pathType": "File"}
    assert volumes["audit-log"]["readOnly"] is False and volumes["audit-log"]["hostPath"] == "/var/log/kubernetes/audit"
    assert volumes["encryption-config"]["readOnly"] is True
    assert ENCRYPTION_CONFIG.startswith(volumes["encryption-config"]["mountPath"] + "/")
    # The policy: in user data (no secret in it); the encryption key: in the secret, 0600.
    user_data, _ = cloud_config(render_api_server_cloud_init(jaguar, lay, 0, REF))
    policy = yaml.safe_load(user_data[AUDIT_POLICY]["content"])
    assert policy["kind"] == "Policy" and policy["apiVersion"] == "audit.k8s.io/v1"
    levels = [(rule["level"], rule) for rule in policy["rules"]]
    secrets_rule = next(rule for level, rule in levels if any("secrets" in r.get("resources", []) for r in rule.get("resources", [])))
    assert secrets_rule["level"] == "Metadata"  # never a Secret's content in the log
    rbac = next(rule for level, rule in levels if any(r.get("group") == "rbac.authorization.k8s.io" for r in rule.get("resources", [])))
    assert rbac["level"] == "RequestResponse" and "get" not in rbac["verbs"]
    assert levels[0][0] == "None" and levels[-1] == ("Metadata", {"level": "Metadata"})
    assert ENCRYPTION_CONFIG not in user_data
    encryption = files[ENCRYPTION_CONFIG]
    assert encryption["permissions"] == "0600"
    config = yaml.safe_load(encryption["content"])
    assert config["kind"] == "EncryptionConfiguration"
    (resource,) = config["resources"]
    assert resource["resources"] == ["secrets"]
    assert resource["providers"][0] == {"secretbox": {"keys": [{"name": "corral-1", "secret": ENCRYPTION_KEY}]}}
    assert resource["providers"][-1] == {"identity": {}}  # Secrets written before still read


def test_token_lifetime_is_what_the_stack_says():
    heron = example("heron")
    init = docs(render_kubeadm_init_config(heron, layout(heron), TOKENS, token_ttl_hours=6))["InitConfiguration"]
    assert [t["ttl"] for t in init["bootstrapTokens"]] == ["6h0m0s", "6h0m0s"]
    assert [t["description"] for t in init["bootstrapTokens"]] == ["API servers", "a pool"]
