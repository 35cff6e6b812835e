"""Node identity (issue 25, items 4 and 9): corral-node-approver approves a pool token's
kubelet client certificate only for a machine of that pool, and labels pool nodes with
labels their kubelets cannot set.

The requests are real PKCS#10 requests made with `cryptography` (RSA and ECDSA, with
and without subject alternative names), read by the controller's own stdlib reader;
the configuration is the one rendered for the example clusters. The loop runs against
a fake API server at the network boundary (tests/certs/fake_csr_apiserver.py).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import ipaddress
import re
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from corral.certs import node_approver as approver
from corral.manifests import monitoring
from corral.manifests import node_approver as addon
from corral.manifests.monitoring import SHARD_NODE_LABEL
from corral.manifests.policy import POOL_NODE_LABEL, TEAM_NODE_LABEL
from corral.model import load_fleet
from corral.model.schema import Monitoring
from corral.nodes.join import pool_token_group
from tests.certs.fake_csr_apiserver import FakeCsrApiServer

ROOT = Path(__file__).resolve().parents[2]
FLEET = load_fleet([ROOT / "clusters"])
JAGUAR = FLEET.clusters["jaguar"]   # on-prem pools (one reserved by robotics) and an Azure pool
HERON = FLEET.clusters["heron"]     # AWS pools only (one reserved by inference)
CLIENT_USAGES_RSA = ["digital signature", "key encipherment", "client auth"]
CLIENT_USAGES_EC = ["digital signature", "client auth"]


def request_pem(common_name: str, organizations=("system:nodes",), dns_names=(), ip_addresses=(),
                key_kind: str = "ec") -> bytes:
    """A PKCS#10 request as the kubelet makes one (cryptography), PEM."""
    key = rsa.generate_private_key(65537, 2048) if key_kind == "rsa" else ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations),
                         x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    names = [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def csr(node: str, groups, *, name: str = "csr-1", usages=None, username: str = "system:bootstrap:abc123",
        signer: str = approver.SIGNER, **request) -> dict:
    """A CertificateSigningRequest as the API server returns it (spec.groups set from the requester)."""
    kind = request.get("key_kind", "ec")
    return {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "resourceVersion": "1", "uid": f"uid-{name}"},
        "spec": {"signerName": signer, "username": username,
                 "groups": ["system:bootstrappers", *groups, "system:authenticated"],
                 "usages": usages or (CLIENT_USAGES_RSA if kind == "rsa" else CLIENT_USAGES_EC),
                 "request": base64.b64encode(request_pem(f"system:node:{node}", **request)).decode()},
        "status": {},
    }


def decide(cluster, request: dict, existing: tuple[str, ...] = ()) -> approver.Decision | None:
    return approver.decide(request, addon.config(cluster), lambda name: name in existing)


ROBOTICS = pool_token_group("gpu-h100-robotics")   # jaguar gpu-[065:072].sf1.internal, team robotics
SHARED_GPU = pool_token_group("gpu-h100-sf1")      # jaguar gpu-[001:064].sf1.internal
AZURE_CPU = pool_token_group("cpu-d64")            # jaguar scale sets jaguar-cpu-d64-<zone>


# --- reading the request ------------------------------------------------------------


@pytest.mark.parametrize("key_kind", ["ec", "rsa"])
def test_the_stdlib_reader_sees_what_cryptography_wrote(key_kind):
    pem = request_pem("system:node:gpu-070", organizations=("system:nodes", "extra"), dns_names=("a.example",),
                      key_kind=key_kind)
    seen = approver.read_request(pem)
    assert seen.common_names == ("system:node:gpu-070",)
    assert seen.organizations == ("system:nodes", "extra")
    assert seen.has_alt_names
    assert not approver.read_request(request_pem("system:node:x")).has_alt_names


def test_garbage_is_a_bad_request_not_a_crash():
    for junk in (b"", b"-----BEGIN CERTIFICATE REQUEST-----\n!!!\n-----END CERTIFICATE REQUEST-----", b"\x30\x05\x02"):
        with pytest.raises(approver.BadRequest):
            approver.read_request(junk)
    request = csr("gpu-070.sf1.internal", [ROBOTICS])
    request["spec"]["request"] = base64.b64encode(b"\x30\x03\x02\x01\x00").decode()
    decision = decide(JAGUAR, request)
    assert decision is not None and not decision.approve and decision.reason == "UnreadableRequest"


# --- the decision ----------------------------------------------------------------------


@pytest.mark.parametrize("node, key_kind", [
    ("gpu-070.sf1.internal", "ec"),    # the full host name
    ("gpu-065", "rsa"),                # the short name the system may report
    ("gpu-072.sf1.internal", "rsa"),   # the last host of the range
])
def test_a_pool_token_gets_a_certificate_for_a_machine_of_its_own_pool(node, key_kind):
    decision = decide(JAGUAR, csr(node, [ROBOTICS], key_kind=key_kind))
    assert decision == approver.Decision(True, "CorralPoolMember", decision.message, "gpu-h100-robotics")
    assert node in decision.message


@pytest.mark.parametrize("node, reason", [
    ("gpu-010.sf1.internal", "NotInPool"),    # the shared pool's host
    ("gpu-073.sf1.internal", "NotInPool"),    # past the range
    ("gpu-70.sf1.internal", "NotInPool"),     # the range is zero-padded to three digits
    ("gpu-070.ny1.internal", "NotInPool"),    # another domain
    ("jaguar-cpu-d64-1-abc123", "NotInPool"),  # an Azure pool's machine
    ("jaguar-apiserver-0", "ReservedName"),   # an API server
    ("jaguar-etcd-2", "ReservedName"),        # an etcd member
])
def test_a_pool_token_is_denied_any_other_name(node, reason):
    decision = decide(JAGUAR, csr(node, [ROBOTICS]))
    assert decision is not None and not decision.approve
    assert decision.reason == reason, decision


def test_an_existing_nodes_name_is_denied():
    decision = decide(JAGUAR, csr("gpu-070.sf1.internal", [ROBOTICS]), existing=("gpu-070.sf1.internal",))
    assert not decision.approve and decision.reason == "NodeExists"
    assert "delete it first" in decision.message


def test_a_cloud_pool_token_gets_its_scale_sets_names_only():
    # The name rule first: a name none of the pool's scale sets can give is denied unasked ...
    assert decide(JAGUAR, csr("jaguar-cpu-d64-9-0a1b2c", [AZURE_CPU])).reason == "NotInPool"  # no such zone's set
    assert decide(JAGUAR, csr("gpu-001.sf1.internal", [AZURE_CPU])).reason == "NotInPool"      # an on-prem host
    # ... a name one can give goes on to the cloud's API (tests/certs/test_node_approver_cloud.py);
    # with no cloud to ask, it is denied too.
    assert decide(JAGUAR, csr("jaguar-cpu-d64-2-0a1b2c", [AZURE_CPU])).reason == "CloudCheckUnavailable"


def test_on_aws_the_requesters_pool_decides_and_other_teams_pools_stay_theirs():
    inference = pool_token_group("gpu-a10g-inference")
    # Every AWS pool's rule fits an EC2 name: the requester's pool is the one the cloud is asked about.
    decision = decide(HERON, csr("ip-10-20-3-4.ec2.internal", [inference]))
    assert decision.reason == "CloudCheckUnavailable" and "pool gpu-a10g-inference" in decision.message
    assert decide(HERON, csr("heron-apiserver-1", [inference])).reason == "ReservedName"


@pytest.mark.parametrize("why, request_args, reason", [
    ("server usages", {"usages": ["digital signature", "key encipherment", "server auth"]}, "WrongUsages"),
    ("an extra usage", {"usages": CLIENT_USAGES_RSA + ["server auth"]}, "WrongUsages"),
    ("another organization", {"organizations": ("system:masters",)}, "WrongOrganization"),
    ("two organizations", {"organizations": ("system:nodes", "system:masters")}, "WrongOrganization"),
    ("a DNS alt name", {"dns_names": ("kubernetes.default",)}, "AltNamesNotAllowed"),
    ("an IP alt name", {"ip_addresses": ("10.0.0.1",)}, "AltNamesNotAllowed"),
    ("a user that is no bootstrap token", {"username": "system:serviceaccount:team-a:x"}, "NotABootstrapToken"),
])
def test_a_request_that_is_no_kubelet_client_request_is_denied(why, request_args, reason):
    decision = decide(JAGUAR, csr("gpu-070.sf1.internal", [ROBOTICS], **request_args))
    assert decision is not None and not decision.approve and decision.reason == reason, why


def test_a_common_name_that_is_no_node_is_denied():
    request = csr("x", [ROBOTICS])
    request["spec"]["request"] = base64.b64encode(request_pem("system:admin")).decode()
    assert decide(JAGUAR, request).reason == "WrongCommonName"


def test_kubeadm_default_group_is_not_this_approvers_and_with_a_pool_group_is_denied():
    # The API servers' own token (kubeadm's default group) and kubelets renewing their
    # certificates (system:nodes) are kube-controller-manager's to approve.
    assert decide(JAGUAR, csr("jaguar-apiserver-0", [approver.KUBEADM_DEFAULT_GROUP])) is None
    renewal = csr("gpu-070.sf1.internal", ["system:nodes"], username="system:node:gpu-070.sf1.internal")
    assert decide(JAGUAR, renewal) is None
    # A pool token that is also in the default group would be auto-approved for any name.
    both = decide(JAGUAR, csr("gpu-070.sf1.internal", [ROBOTICS, approver.KUBEADM_DEFAULT_GROUP]))
    assert not both.approve and both.reason == "KubeadmDefaultGroup"


def test_an_onprem_run_token_of_several_pools_gets_each_pools_hosts_only():
    groups = [ROBOTICS, SHARED_GPU]
    assert decide(JAGUAR, csr("gpu-001.sf1.internal", groups)).pool == "gpu-h100-sf1"
    assert decide(JAGUAR, csr("gpu-066.sf1.internal", groups)).pool == "gpu-h100-robotics"
    assert not decide(JAGUAR, csr("jaguar-cpu-d64-1-abc123", groups)).approve


def test_decided_requests_and_other_signers_are_left_alone():
    approved = csr("gpu-070.sf1.internal", [ROBOTICS])
    approved["status"] = {"conditions": [{"type": "Approved", "status": "True"}]}
    assert decide(JAGUAR, approved) is None
    assert decide(JAGUAR, csr("gpu-070.sf1.internal", [ROBOTICS], signer="kubernetes.io/kubelet-serving")) is None


# --- the labels no kubelet can set -------------------------------------------------------


def node(name: str, **labels) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}, "spec": {}}


def test_reserved_pool_nodes_get_the_team_label_and_shared_nodes_lose_a_forged_one():
    config = addon.config(JAGUAR)   # one Prometheus shard: every node's is 0
    wanted = approver.wanted_labels(node("gpu-070.sf1.internal"), config, {})
    assert wanted == {POOL_NODE_LABEL: "gpu-h100-robotics", TEAM_NODE_LABEL: "robotics", SHARD_NODE_LABEL: "0"}
    # A shared node labelled as the team's (by hand, or by an older approver's bug): removed.
    forged = node("gpu-002.sf1.internal", **{TEAM_NODE_LABEL: "robotics", "corral.dev/team": "robotics",
                                               SHARD_NODE_LABEL: "0"})
    wanted = approver.wanted_labels(forged, config, {})
    assert approver.label_patch(forged, wanted) == {
        "metadata": {"labels": {POOL_NODE_LABEL: "gpu-h100-sf1", TEAM_NODE_LABEL: None}}}
    # The API servers and unknown machines get no pool labels, only their monitoring shard.
    assert approver.pool_labels(node("jaguar-apiserver-0"), config, {}) is None
    assert approver.pool_labels(node("laptop"), config, {}) is None
    assert approver.wanted_labels(node("jaguar-apiserver-0"), config, {}) == {SHARD_NODE_LABEL: "0"}
    assert approver.wanted_labels(node("laptop"), config, {}) == {SHARD_NODE_LABEL: "0"}


def test_aws_nodes_take_their_pool_from_the_approved_request_or_the_approvers_own_label():
    config = addon.config(HERON)
    name = "ip-10-20-3-4.ec2.internal"
    # The kubelet-set corral.dev/pool says nothing: every AWS pool's rule fits the name.
    assert approver.pool_labels(node(name, **{"corral.dev/pool": "gpu-a10g-inference"}), config, {}) is None
    request = csr(name, [pool_token_group("gpu-a10g-inference")])
    request["status"] = {"conditions": [{"type": "Approved", "status": "True", "reason": "CorralPoolMember"}]}
    approved = approver.approved_pools([request], config)
    assert approved == {name: "gpu-a10g-inference"}
    assert approver.pool_labels(node(name), config, approved) == {
        POOL_NODE_LABEL: "gpu-a10g-inference", TEAM_NODE_LABEL: "inference"}
    # After the request is gone (an hour), the approver's own pool label carries it on.
    shard = approver.monitoring_shard_label(node(name), config)
    labelled = node(name, **{POOL_NODE_LABEL: "gpu-a10g-inference", TEAM_NODE_LABEL: "inference"}, **shard)
    assert approver.label_patch(labelled, approver.wanted_labels(labelled, config, {})) is None


# --- the controller's loop against an API server -----------------------------------------


def test_one_round_approves_denies_and_labels_through_the_api(tmp_path, monkeypatch):
    config_file = tmp_path / "config.json"
    config_file.write_text(addon.files(JAGUAR)["config.json"])
    requests = [
        csr("gpu-071.sf1.internal", [ROBOTICS], name="good"),
        csr("jaguar-apiserver-0", [ROBOTICS], name="api-server"),
        csr("gpu-003.sf1.internal", [ROBOTICS], name="other-pool"),
        csr("jaguar-apiserver-1", [approver.KUBEADM_DEFAULT_GROUP], name="kubeadm"),
    ]
    nodes = [node("gpu-066.sf1.internal", **{"corral.dev/team": "robotics"}), node("jaguar-apiserver-0"),
             node("gpu-004", **{TEAM_NODE_LABEL: "robotics"})]
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("approver-token\n")
    with FakeCsrApiServer(tmp_path, "approver-token", requests, nodes) as api:
        (sa / "ca.crt").write_bytes(api.ca.read_bytes())
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        monkeypatch.setenv("CORRAL_SA_DIR", str(sa))
        monkeypatch.setenv("CORRAL_NODE_APPROVER_CONFIG", str(config_file))
        assert approver.main(["node_approver.py", "--once"]) == 0
        outcome = {name: [(c["type"], c["reason"]) for c in api.csrs[name]["status"].get("conditions", [])]
                   for name in api.csrs}
        assert outcome == {"good": [("Approved", "CorralPoolMember")], "api-server": [("Denied", "ReservedName")],
                           "other-pool": [("Denied", "NotInPool")], "kubeadm": []}
        assert {(e["involvedObject"]["name"], e["type"], e["reason"]) for e in api.events} == {
            ("good", "Normal", "CorralPoolMember"), ("api-server", "Warning", "ReservedName"),
            ("other-pool", "Warning", "NotInPool")}
        labels = {name: n["metadata"]["labels"] for name, n in api.nodes.items()}
        assert labels["gpu-066.sf1.internal"] == {"corral.dev/team": "robotics", POOL_NODE_LABEL: "gpu-h100-robotics",
                                                  TEAM_NODE_LABEL: "robotics", SHARD_NODE_LABEL: "0"}
        # A shared node keeps no team label.
        assert labels["gpu-004"] == {POOL_NODE_LABEL: "gpu-h100-sf1", SHARD_NODE_LABEL: "0"}
        assert labels["jaguar-apiserver-0"] == {SHARD_NODE_LABEL: "0"}
        # A second round finds nothing to do: idempotent.
        writes = [r for r in api.requests if r[0] != "GET"]
        assert approver.main(["node_approver.py", "--once"]) == 0
        assert [r for r in api.requests if r[0] != "GET"] == writes


def test_a_lost_race_is_retried_next_round_not_a_crash(tmp_path, monkeypatch):
    config_file = tmp_path / "config.json"
    config_file.write_text(addon.files(JAGUAR)["config.json"])
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    request = csr("gpu-071.sf1.internal", [ROBOTICS], name="raced")
    with FakeCsrApiServer(tmp_path, "t", [request], []) as api:
        (sa / "ca.crt").write_bytes(api.ca.read_bytes())
        api.csrs["raced"]["metadata"]["resourceVersion"] = "2"  # changed after the list: 409
        original = api.answer

        def stale_list(method, path, body, content_type):
            code, answer = original(method, path, body, content_type)
            if method == "GET" and path.startswith(approver.CSR_PATH + "?"):
                answer = copy.deepcopy(answer)
                for item in answer["items"]:
                    item["metadata"]["resourceVersion"] = "1"
            return code, answer

        api.answer = stale_list
        for key, value in {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
                           "CORRAL_SA_DIR": str(sa), "CORRAL_NODE_APPROVER_CONFIG": str(config_file)}.items():
            monkeypatch.setenv(key, value)
        assert approver.main(["node_approver.py", "--once"]) == 1
        assert api.csrs["raced"]["status"] == {}


def test_the_configmaps_files_run_as_a_script(tmp_path):
    """As the pod runs it (the Deployment's command: `python3 /opt/corral-node-approver/node_approver.py`), with
    kube_watch.py beside it and no corral package to import from."""
    import subprocess
    import sys

    folder = tmp_path / "opt"
    folder.mkdir()
    for name, text in addon.files(JAGUAR).items():
        (folder / name).write_text(text)
    assert {"node_approver.py", "kube_watch.py", "config.json"} <= {p.name for p in folder.iterdir()}
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    with FakeCsrApiServer(tmp_path, "t", [csr("gpu-071.sf1.internal", [ROBOTICS], name="good")], []) as api:
        (sa / "ca.crt").write_bytes(api.ca.read_bytes())
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
               "CORRAL_SA_DIR": str(sa), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
        done = subprocess.run([sys.executable, str(folder / "node_approver.py"), "--once"], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert [c["reason"] for c in api.csrs["good"]["status"]["conditions"]] == ["CorralPoolMember"]


# --- the monitoring shard label (issue 28, item 5) -----------------------------------------


def md5_hashmod(value: str, modulus: int) -> int:
    """Prometheus' hashmod re-derived here, not imported: the last 8 bytes of the MD5 digest,
    big-endian (prometheus/prometheus v2.55.1 model/relabel/relabel.go, `case HashMod`)."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:16], "big") % modulus


def relabel_keeps(relabel_configs: list[dict], target: dict[str, str]) -> bool:
    """Whether Prometheus keeps `target` after `relabel_configs`: the actions the shard jobs
    use (hashmod, keep, and the default replace), after relabel.go's Process (source labels
    joined by ";", regexes anchored at both ends)."""
    labels = dict(target)
    for rule in relabel_configs:
        value = rule.get("separator", ";").join(labels.get(name, "") for name in rule.get("source_labels", []))
        action = rule.get("action", "replace")
        if action == "hashmod":
            labels[rule["target_label"]] = str(md5_hashmod(value, rule["modulus"]))
        elif action == "keep":
            if not re.fullmatch(rule["regex"], value):
                return False
        elif action == "replace":
            found = re.fullmatch(rule.get("regex", "(.*)"), value)
            if found:
                labels[rule["target_label"]] = found.expand(rule.get("replacement", "$1").replace("$1", r"\1"))
        else:
            raise AssertionError(f"relabel action {action} is not evaluated here")
    return True


def selects(label_selector: str, labels: dict[str, str]) -> bool:
    """An equality-based label selector (`key=value`, comma-separated) against a node's labels."""
    return all(labels.get(key) == value for key, value in (term.split("=", 1) for term in label_selector.split(",")))


def test_the_hashmod_is_prometheus_own():
    # Prometheus' own expected outputs (model/relabel/relabel_test.go, v2.55.1: "baz" -> 976 and
    # "foo\nbar" -> 734 with modulus 1000).
    assert approver.prometheus_hashmod("baz", 1000) == 976
    assert approver.prometheus_hashmod("foo\nbar", 1000) == 734
    for name in ("gpu-001.sf1.internal", "jaguar-apiserver-0", "ip-10-20-3-4.ec2.internal", "laptop"):
        for modulus in (1, 2, 3, 8, 64):
            assert approver.prometheus_hashmod(name, modulus) == md5_hashmod(name, modulus), (name, modulus)


SHARDS = 4
SHARDED_JAGUAR = JAGUAR.model_copy(update={"monitoring": Monitoring(shards=SHARDS)})


def test_every_node_is_labelled_with_the_shard_whose_relabelling_keeps_it(tmp_path, monkeypatch):
    """A pool node, an API server and a node of no pool: each gets the shard label, and exactly
    the shard the label names keeps it, by the rendered shard configs' own hashmod, and selects
    it by its node watch's label selector. A second round writes nothing."""
    import yaml

    config_file = tmp_path / "config.json"
    config_file.write_text(addon.files(SHARDED_JAGUAR)["config.json"])
    names = ["gpu-066.sf1.internal", "gpu-004", "jaguar-apiserver-0", "jaguar-apiserver-2", "laptop",
             *(f"gpu-{i:03d}.sf1.internal" for i in range(10, 30))]
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    with FakeCsrApiServer(tmp_path, "t", [], [node(name) for name in names]) as api:
        (sa / "ca.crt").write_bytes(api.ca.read_bytes())
        for key, value in {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
                           "CORRAL_SA_DIR": str(sa), "CORRAL_NODE_APPROVER_CONFIG": str(config_file)}.items():
            monkeypatch.setenv(key, value)
        assert approver.main(["node_approver.py", "--once"]) == 0
        labels = {name: api.nodes[name]["metadata"]["labels"] for name in names}
        writes = [r for r in api.requests if r[0] != "GET"]
        assert approver.main(["node_approver.py", "--once"]) == 0
        assert [r for r in api.requests if r[0] != "GET"] == writes   # write on change only
    assert POOL_NODE_LABEL not in labels["laptop"] and POOL_NODE_LABEL not in labels["jaguar-apiserver-0"]
    assert labels["gpu-066.sf1.internal"][POOL_NODE_LABEL] == "gpu-h100-robotics"
    kubelet_jobs = []
    for shard in range(SHARDS):
        rendered = yaml.safe_load(monitoring.shard_config(SHARDED_JAGUAR, True, shard, SHARDS))
        (job,) = [j for j in rendered["scrape_configs"] if j["job_name"] == "kubelet-cadvisor"]
        (watch,) = job["kubernetes_sd_configs"]
        (selector,) = watch["selectors"]
        kubelet_jobs.append((selector["label"], job["relabel_configs"]))
    for name in names:
        kept_by = [shard for shard, (_, rules) in enumerate(kubelet_jobs)
                   if relabel_keeps(rules, {"__meta_kubernetes_node_name": name})]
        watched_by = [shard for shard, (selector, _) in enumerate(kubelet_jobs) if selects(selector, labels[name])]
        assert kept_by == watched_by == [int(labels[name][SHARD_NODE_LABEL])], name
    # Four shards of 25 nodes: the label is not one constant.
    assert len({labels[name][SHARD_NODE_LABEL] for name in names}) > 1
