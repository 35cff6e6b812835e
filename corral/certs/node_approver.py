"""corral-node-approver: kubelet client certificates only for a pool's own machines (issue 25, items 4 and 9).

Standard library only: it runs as it is from a ConfigMap in the stock Python
image (as the GPU health agent does), one replica on the API servers
(`corral/manifests/node_approver.py` renders it and its configuration).

Why it exists. A joining machine's kubelet asks for its client certificate
with a bootstrap token (a CertificateSigningRequest for the signer
kubernetes.io/kube-apiserver-client-kubelet, CN `system:node:<name>`).
kubeadm binds its default token group to the auto-approval ClusterRole
(`kubeadm:node-autoapprove-bootstrap`, cmd/kubeadm/app/phases/bootstraptoken/
node/tlsbootstrap.go), and kube-controller-manager then approves ANY node
name for a token holder: another team's machine, an API server. corral's pool
tokens carry a group of their own instead (`system:bootstrappers:corral:pool:
<pool>`, which that binding does not cover), and this controller approves a
request only when:

- the requester is a bootstrap token (`system:bootstrap:<id>`) in a corral
  pool group, and not also in kubeadm's default group;
- the request is a kubelet client request as the signer requires it
  (kubernetes/website, certificate-signing-requests.md, "Kubernetes signers";
  kubernetes pkg/apis/certificates/v1/helpers.go ValidateKubeletClientCSR):
  organizations exactly [system:nodes], CN `system:node:<name>`, no subject
  alternative names, usages exactly {digital signature, key encipherment,
  client auth} or {digital signature, client auth};
- <name> is no API server's or etcd member's name and no existing Node (a
  token holder cannot take over a running node's identity);
- <name> belongs to exactly one pool, and that pool is one of the requester's:
  on-prem, a host of the pool's host patterns in the cluster file (the full
  name or its first label); cloud, the pool's naming rule (its scale sets' or
  MIGs' instance names; on AWS the EC2 IP-based name, which does not tell
  pools apart, so the requester's pool decides);
- cloud pools only: the cloud's API, asked read-only with the API servers'
  own identity (corral/health/cloud_api.py, shipped beside this file), says
  an instance whose node name is <name> exists in one of that pool's groups
  (its ASG, zonal MIGs or scale sets, in this cluster's region and the API
  servers' own project / subscription and resource group) and is running.
  A name rule alone lets a token holder name a machine that does not exist
  or that belongs to another pool's group. If the cloud cannot be asked, the
  request is denied (a Denied condition saying so; the kubelet starts its TLS
  bootstrap again with a new request). Answers are kept
  MEMBERSHIP_CACHE_SECONDS per pool and name. On-prem pools keep the name
  rule: there is no cloud API to ask, and the site's inventory in the
  cluster file (reviewed like code) is the attestation.

Anything else from a pool group is denied (a Denied condition with the reason,
a log line, an Event); requests from outside the pool groups (kubelets
renewing their own certificate, the API servers' token) are left to
kube-controller-manager.

Then it labels every node, once registered, with the Prometheus shard that
scrapes it (`.../corral-monitoring-shard=<i>`, Prometheus' own hashmod of the
node name, so each shard's node watch selects only its share: docs/scale.md,
"Monitoring at 7,500 nodes"), and each pool node with labels its kubelet cannot
set (NodeRestriction refuses kubelets any `node-restriction.kubernetes.io/`
label, kubernetes/website admission-controllers.md): the pool and, for a
reserved pool, the team. Team placement selects those, not the kubelet-set
`corral.dev/team`. The pool of a node comes from its name (exactly one pool's
rule matches), else from this controller's own pool label (only admins and
this controller can set it), else from the request this controller approved
for that name (CSRs are kept an hour after approval). Nothing else is kept,
so a restart loses nothing.

What it reads (issue 28, item 2; docs/scale.md). No polling: it lists the
kubelet client requests (a field selector on their signer) and every node
once, from the API server's watch cache, then watches the requests and only
the nodes without its pool label (a label selector), with bookmarks, resumed
from the last resourceVersion; 410 Gone relists from etcd, and a jittered
resync relists once an hour (the two watches taking turns). kube_watch.py,
beside this file, does the listing and watching. A request is decided when
its watch event arrives (with one consistent GET of the node name it asks
for), a node labelled when it registers; each write is made once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

try:
    from corral.health import cloud_api

    from .kube_watch import API_ERRORS, RETRY_SECONDS, ListWatch, SystemClock, take_waiting
except ImportError:   # run as a script from the ConfigMap: kube_watch.py and cloud_api.py are beside it
    import cloud_api
    from kube_watch import API_ERRORS, RETRY_SECONDS, ListWatch, SystemClock, take_waiting

SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
POOL_GROUP_PREFIX = "system:bootstrappers:corral:pool:"
KUBEADM_DEFAULT_GROUP = "system:bootstrappers:kubeadm:default-node-token"
BOOTSTRAP_USER_PREFIX = "system:bootstrap:"
NODE_USER_PREFIX = "system:node:"
NODES_ORGANIZATION = "system:nodes"
# ValidateKubeletClientCSR: either set, nothing more.
CLIENT_USAGES = (
    frozenset({"digital signature", "key encipherment", "client auth"}),
    frozenset({"digital signature", "client auth"}),
)
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
COMPONENT = "corral-node-approver"
# How long the cloud's answer about one pool's node name is reused: a kubelet's retries
# and a resync's second look cost no second call; an instance that stops is seen again
# well within a join (kubeadm waits 5 minutes for the TLS bootstrap).
MEMBERSHIP_CACHE_SECONDS = 30


# --- a PKCS#10 request, read with the standard library ------------------------
#
# CertificationRequest ::= SEQUENCE { certificationRequestInfo SEQUENCE {
#   version INTEGER, subject Name, subjectPKInfo SEQUENCE, attributes [0] },
#   signatureAlgorithm, signature } (RFC 2986). Only the subject and the
# extension request's subjectAltName matter here.

OID_COMMON_NAME = "2.5.4.3"
OID_ORGANIZATION = "2.5.4.10"
OID_EXTENSION_REQUEST = "1.2.840.113549.1.9.14"
OID_SUBJECT_ALT_NAME = "2.5.29.17"


class BadRequest(ValueError):
    """The CSR's request is not a PKCS#10 request this controller can read."""


def _der(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at `at`."""
    if at + 2 > len(data):
        raise BadRequest("truncated DER")
    tag, length = data[at], data[at + 1]
    at += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or at + count > len(data):
            raise BadRequest("bad DER length")
        length = int.from_bytes(data[at:at + count], "big")
        at += count
    if at + length > len(data):
        raise BadRequest("truncated DER")
    return tag, at, at + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out, at = [], start
    while at < end:
        tag, content, stop = _der(data, at)
        out.append((tag, content, stop))
        at = stop
    return out


def _oid(raw: bytes) -> str:
    if not raw:
        raise BadRequest("empty OID")
    parts = [raw[0] // 40, raw[0] % 40]
    value = 0
    for byte in raw[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    return ".".join(map(str, parts))


@dataclass(frozen=True)
class RequestSubject:
    common_names: tuple[str, ...]
    organizations: tuple[str, ...]
    has_alt_names: bool


def read_request(pem_or_der: bytes) -> RequestSubject:
    """The subject and whether subject alternative names are asked for, of a PEM or DER request."""
    text = pem_or_der.strip()
    if text.startswith(b"-----BEGIN"):
        body = b"".join(line for line in text.splitlines() if not line.startswith(b"-----"))
        try:
            data = base64.b64decode(body, validate=True)
        except ValueError:
            raise BadRequest("not base64 PEM") from None
    else:
        data = text
    tag, start, end = _der(data, 0)
    if tag != 0x30:
        raise BadRequest("not a SEQUENCE")
    outer = _children(data, start, end)
    if not outer or outer[0][0] != 0x30:
        raise BadRequest("no certificationRequestInfo")
    info = _children(data, outer[0][1], outer[0][2])
    if len(info) < 3 or info[1][0] != 0x30:
        raise BadRequest("no subject")
    common_names, organizations = [], []
    for rdn_tag, rdn_start, rdn_end in _children(data, info[1][1], info[1][2]):
        for _, atv_start, atv_end in _children(data, rdn_start, rdn_end):
            oid_el, value_el = _children(data, atv_start, atv_end)[:2]
            oid, value = _oid(data[oid_el[1]:oid_el[2]]), data[value_el[1]:value_el[2]].decode("utf-8", "replace")
            if oid == OID_COMMON_NAME:
                common_names.append(value)
            elif oid == OID_ORGANIZATION:
                organizations.append(value)
    has_alt_names = False
    for attr_tag, attr_start, attr_end in info[3:]:
        if attr_tag != 0xA0:  # [0] attributes
            continue
        for _, a_start, a_end in _children(data, attr_start, attr_end):
            parts = _children(data, a_start, a_end)
            if len(parts) < 2 or _oid(data[parts[0][1]:parts[0][2]]) != OID_EXTENSION_REQUEST:
                continue
            for _, ext_start, ext_end in _children(data, parts[1][1], parts[1][2]):  # SET OF Extensions
                for _, e_start, e_end in _children(data, ext_start, ext_end):  # Extensions: SEQUENCE OF
                    fields = _children(data, e_start, e_end)
                    if fields and _oid(data[fields[0][1]:fields[0][2]]) == OID_SUBJECT_ALT_NAME:
                        has_alt_names = True
    return RequestSubject(tuple(common_names), tuple(organizations), has_alt_names)


# --- which pool a node name belongs to -------------------------------------------

_RANGE = re.compile(r"\[([0-9]+):([0-9]+)\]")


def _host_pattern_matches(pattern: str, name: str) -> bool:
    """Whether `name` is one of the hosts `pattern` (`gpu-[001:064].sf1.internal`,
    Ansible's range syntax, corral/model/hosts.py) expands to, as the full name
    or its first label (nodes register with the host name the system reports)."""
    first_label = pattern.split(".", 1)[0]
    for candidate in (pattern, first_label):
        ranges = list(_RANGE.finditer(candidate))
        regex, last = "", 0
        for found in ranges:
            regex += re.escape(candidate[last:found.start()]) + "([0-9]+)"
            last = found.end()
        regex += re.escape(candidate[last:])
        match = re.fullmatch(regex, name)
        if not match:
            continue
        fits = True
        for found, digits in zip(ranges, match.groups()):
            first, end = found.group(1), found.group(2)
            width = len(first) if first.startswith("0") else 0
            number = int(digits)
            padded = f"{number:0{width}d}" if width else str(number)
            if digits != padded or not int(first) <= number <= int(end):
                fits = False
                break
        if fits:
            return True
    return False


def name_in_pool(pool: dict, name: str) -> bool:
    """Whether `name` follows `pool`'s naming rule (config: hosts or name_patterns)."""
    if any(_host_pattern_matches(p, name) for p in pool.get("hosts", [])):
        return True
    return any(re.fullmatch(p, name) for p in pool.get("name_patterns", []))


def pools_of_name(config: dict, name: str) -> list[str]:
    return sorted(p for p, pool in config["pools"].items() if name_in_pool(pool, name))


# --- the decision (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """Approve or deny a request; `pool` is the pool the name was approved for."""

    approve: bool
    reason: str
    message: str
    pool: str | None = None


def _condition_types(csr: dict) -> set[str]:
    return {c.get("type") for c in (csr.get("status") or {}).get("conditions") or []}


def decide(csr: dict, config: dict, node_exists, cloud_membership=None) -> Decision | None:
    """What to do with `csr` (a CertificateSigningRequest as the API returns it).

    None: not this controller's to decide (another signer, already decided, a
    requester outside the corral pool groups). `node_exists(name)` says
    whether a Node of that name exists; `cloud_membership(pool, name)` (a
    CloudMembership) what the cloud says of a cloud pool's name, as a
    Decision. Without it no cloud pool's name is approved.
    """
    spec = csr.get("spec") or {}
    if spec.get("signerName") != SIGNER or _condition_types(csr) & {"Approved", "Denied"}:
        return None
    groups = spec.get("groups") or []
    pool_groups = [g for g in groups if g.startswith(POOL_GROUP_PREFIX)]
    if not pool_groups:
        return None

    def deny(reason: str, message: str) -> Decision:
        return Decision(False, reason, message)

    username = spec.get("username", "")
    if not username.startswith(BOOTSTRAP_USER_PREFIX):
        return deny("NotABootstrapToken", f"requester {username} is not a bootstrap token")
    if KUBEADM_DEFAULT_GROUP in groups:
        return deny("KubeadmDefaultGroup", f"requester {username} is in {KUBEADM_DEFAULT_GROUP} as well as a pool group")
    try:
        subject = read_request(base64.b64decode(spec.get("request", "")))
    except (BadRequest, ValueError, IndexError) as err:
        return deny("UnreadableRequest", f"the request is not a PKCS#10 request: {err}")
    usages = frozenset(spec.get("usages") or [])
    if usages not in CLIENT_USAGES:
        return deny("WrongUsages", f"usages {sorted(usages)} are not a kubelet client certificate's")
    if list(subject.organizations) != [NODES_ORGANIZATION]:
        return deny("WrongOrganization", f"organizations {list(subject.organizations)} are not [{NODES_ORGANIZATION}]")
    if subject.has_alt_names:
        return deny("AltNamesNotAllowed", "a kubelet client request may not ask for subject alternative names")
    if len(subject.common_names) != 1 or not subject.common_names[0].startswith(NODE_USER_PREFIX):
        return deny("WrongCommonName", f"common name {list(subject.common_names)} is not {NODE_USER_PREFIX}<name>")
    name = subject.common_names[0][len(NODE_USER_PREFIX):]
    if name in config.get("reserved_names", []):
        return deny("ReservedName", f"{name} is an API server's or etcd member's name")
    if node_exists(name):
        return deny("NodeExists", f"node {name} already exists: delete it first if this machine replaces it")
    requester_pools = sorted(g[len(POOL_GROUP_PREFIX):] for g in pool_groups)
    candidates = [p for p in requester_pools if p in config["pools"] and name_in_pool(config["pools"][p], name)]
    if not candidates:
        return deny("NotInPool", f"{name} is not a machine of pool {', '.join(requester_pools)}")
    if len(candidates) > 1:
        return deny("AmbiguousPool", f"{name} fits pools {', '.join(candidates)}: the request cannot say which")
    pool = candidates[0]
    if config["pools"][pool].get("groups"):
        if cloud_membership is None:
            return deny("CloudCheckUnavailable", f"{name} of cloud pool {pool}: no cloud API to confirm the instance")
        confirmed = cloud_membership(pool, name)
        if not confirmed.approve:
            return confirmed
        return Decision(True, "CorralPoolMember", f"{name} is a machine of pool {pool} ({username}): "
                        f"{confirmed.message}", pool)
    return Decision(True, "CorralPoolMember", f"{name} is a machine of pool {pool} ({username})", pool)


# --- the cloud's word on a cloud pool's node name (impure) -------------------------------


class CloudMembership:
    """Whether a cloud pool's node name is a running instance of one of the pool's groups,
    as the cloud's API says (read-only: cloud_api.find_instance), as a Decision whose
    message names the instance or what was looked for. Answers are kept
    MEMBERSHIP_CACHE_SECONDS per (pool, name); an API failure is never kept. `counts`
    tallies the outcomes (logged with each check)."""

    def __init__(self, config: dict, session=None, clock=time.monotonic) -> None:
        self.config = config
        self._session = session
        self.clock = clock
        self.cache: dict[tuple[str, str], tuple[float, Decision]] = {}
        self.counts: dict[str, int] = {}

    def session(self):
        if self._session is None:
            self._session = cloud_api.CloudSession.from_metadata(self.config["cloud"])
        return self._session

    def groups(self, pool: str) -> list:
        """The pool's groups as the cloud client takes them: names, region and zones from the
        cluster file, project / subscription and resource group the API servers' own."""
        return cloud_api.pool_groups(self.config["pools"][pool]["groups"], self.session().identity())

    def __call__(self, pool: str, name: str) -> Decision:
        now = self.clock()
        kept = self.cache.get((pool, name))
        if kept and kept[0] > now:
            self._count(kept[1].reason, pool, name, cached=True)
            return kept[1]
        try:
            decision = self._ask(pool, name)
        except cloud_api.CloudApiError as err:
            decision = Decision(False, "CloudApiError", f"could not confirm {name} is an instance of pool {pool}: "
                                f"{err}; denied, never approved on a name alone")
            self._count(decision.reason, pool, name, cached=False)
            return decision
        self.cache = {key: kept for key, kept in self.cache.items() if kept[0] > now}
        self.cache[(pool, name)] = (now + MEMBERSHIP_CACHE_SECONDS, decision)
        self._count(decision.reason, pool, name, cached=False)
        return decision

    def _ask(self, pool: str, name: str) -> Decision:
        groups = self.groups(pool)
        # A MIG's or scale set's instances are named after it (the name rule): ask only the
        # group whose name the node's starts with. An ASG's are not (AWS): ask each.
        named = [g for g in groups if g.provider != "aws" and name.lower().startswith(g.name.lower() + "-")]
        groups = named or groups
        session = self.session()
        found = [i for i in (cloud_api.find_instance(g, name, session=session) for g in groups) if i is not None]
        running = [i for i in found if i.running]
        if running:
            instance = running[0]
            return Decision(True, "CloudInstance", f"the {instance.provider} API says instance "
                            f"{instance.instance_id} of {instance.group} ({instance.zone or 'no zone'}) is running",
                            pool)
        if found:
            states = ", ".join(f"{i.instance_id} in {i.group}: {i.state}" for i in found)
            return Decision(False, "InstanceNotRunning", f"{name}'s instance in pool {pool}'s groups is not "
                            f"running ({states})")
        names = ", ".join(g.name for g in groups)
        return Decision(False, "NoCloudInstance", f"the {self.config['cloud']} API knows no instance named {name} "
                        f"in pool {pool}'s groups ({names}) of this cluster")

    def _count(self, outcome: str, pool: str, name: str, cached: bool) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        log(cloud_check=name, pool=pool, outcome=outcome, cached=cached, counts=dict(self.counts))


def approved_pools(csrs: list[dict], config: dict) -> dict[str, str]:
    """Node name -> pool, from the requests this controller approved (kept an hour by Kubernetes)."""
    found: dict[str, str] = {}
    for csr in csrs:
        for condition in (csr.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Approved" and condition.get("reason") == "CorralPoolMember":
                spec = csr.get("spec") or {}
                pools = [g[len(POOL_GROUP_PREFIX):] for g in spec.get("groups") or [] if g.startswith(POOL_GROUP_PREFIX)]
                try:
                    names = read_request(base64.b64decode(spec.get("request", ""))).common_names
                except (BadRequest, ValueError, IndexError):
                    continue
                for cn in names:
                    name = cn[len(NODE_USER_PREFIX):]
                    fitting = [p for p in pools if p in config["pools"] and name_in_pool(config["pools"][p], name)]
                    if len(fitting) == 1:
                        found[name] = fitting[0]
    return found


def prometheus_hashmod(value: str, modulus: int) -> int:
    """Prometheus' `hashmod` relabel action: the last 8 bytes of the MD5 of `value`, as a
    big-endian unsigned 64-bit integer, modulo `modulus` (prometheus/prometheus
    model/relabel/relabel.go, `case HashMod`: `binary.BigEndian.Uint64(hash[8:]) % cfg.Modulus`,
    in v2.55.1, the version corral runs, and since v2.43.0; the earlier sum64() shifted all 16
    bytes into a uint64, which kept the same last 8). The shards' relabelling computes this
    of the node name; the label this controller sets must name the same shard."""
    return int.from_bytes(hashlib.md5(value.encode("utf-8")).digest()[8:16], "big") % modulus


def monitoring_shard_label(node: dict, config: dict) -> dict[str, str]:
    """The Prometheus shard of `node` (every node: pool nodes, API servers, any other), as a label."""
    shard = prometheus_hashmod(node["metadata"]["name"], int(config["monitoring_shards"]))
    return {config["labels"]["monitoring_shard"]: str(shard)}


def wanted_labels(node: dict, config: dict, approved: dict[str, str]) -> dict[str, str | None]:
    """The labels this controller owns, as `node` should carry them (None: a value to remove):
    the monitoring shard always, and the pool labels when the node's pool can be told."""
    return {**monitoring_shard_label(node, config), **(pool_labels(node, config, approved) or {})}


def pool_labels(node: dict, config: dict, approved: dict[str, str]) -> dict[str, str | None] | None:
    """The pool and team labels `node` should carry (None: a value to remove), or None when
    the node's pool cannot be told (not a pool node: its pool labels are left alone)."""
    name = node["metadata"]["name"]
    labels = node["metadata"].get("labels") or {}
    pool_label, team_label = config["labels"]["pool"], config["labels"]["team"]
    if name in config.get("reserved_names", []):
        return None
    matching = pools_of_name(config, name)
    if len(matching) == 1:
        pool = matching[0]
    elif labels.get(pool_label) in matching:
        pool = labels[pool_label]
    elif approved.get(name) in matching:
        pool = approved[name]
    else:
        return None
    return {pool_label: pool, team_label: config["pools"][pool].get("team")}


def label_patch(node: dict, wanted: dict[str, str | None]) -> dict | None:
    """The merge patch that brings `node`'s labels to `wanted` (None: nothing to change)."""
    labels = node["metadata"].get("labels") or {}
    changes = {key: value for key, value in wanted.items() if labels.get(key) != value}
    return {"metadata": {"labels": changes}} if changes else None


# --- the API server (impure) -------------------------------------------------------


class Api:
    """The API server, as this pod's service account."""

    def __init__(self) -> None:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        self.base = f"https://{host}:{port}"
        self.sa_dir = os.environ.get("CORRAL_SA_DIR", SA_DIR)
        self.context = ssl.create_default_context(cafile=os.path.join(self.sa_dir, "ca.crt"))

    def open(self, method: str, path: str, body=None, content_type: str = "application/json", timeout: float = 30):
        with open(os.path.join(self.sa_dir, "token")) as fh:  # projected tokens rotate
            token = fh.read().strip()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json",
            # The API server's audit log and priority-and-fairness see who asks.
            "User-Agent": COMPONENT})
        return urllib.request.urlopen(request, context=self.context, timeout=timeout)

    def call(self, method: str, path: str, body=None, content_type: str = "application/json") -> dict:
        with self.open(method, path, body, content_type) as response:
            return json.loads(response.read() or b"{}")

    def stream(self, path: str, timeout: float):
        """A watch: the response, read line by line (one JSON watch event a line)."""
        return self.open("GET", path, timeout=timeout)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def log(**fields) -> None:
    print(json.dumps({"time": now(), "component": COMPONENT, **fields}, sort_keys=True), flush=True)


CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
NODES_PATH = "/api/v1/nodes"
# Only the requests this controller can act on: CSRs support a field selector on
# their signer for list and watch (kubernetes/api certificates/v1 types.go,
# CertificateSigningRequestSpec.signerName: "List/watch requests for
# CertificateSigningRequests can filter on this field using a
# "spec.signerName=NAME" fieldSelector").
CSR_SELECTOR = "fieldSelector=" + urllib.parse.quote(f"spec.signerName={SIGNER}", safe="")


def unlabelled_selector(config: dict) -> str:
    """Nodes without this controller's pool label: a set-based "!key" requirement, which
    list and watch accept as a labelSelector (kubernetes/website content/en/docs/concepts/
    overview/working-with-objects/labels.md, "Set-based requirement" and "LIST and WATCH
    filtering"). Labelled nodes' status updates never reach this controller."""
    return "labelSelector=" + urllib.parse.quote("!" + config["labels"]["pool"], safe="")


def node_exists(api: Api, name: str) -> bool:
    """One consistent read per request decided (not a cache: the decision is who may become
    which node, and the watch sees only unlabelled nodes)."""
    try:
        api.call("GET", f"{NODES_PATH}/{urllib.parse.quote(name, safe='')}")
        return True
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return False
        raise


def record(api: Api, csr: dict, decision: Decision) -> dict:
    """Write the decision on the request's approval subresource (the update carries the
    resourceVersion it was made on: a second copy of this controller loses the race
    harmlessly), then log it and post an Event. Returns the request as stored."""
    name = csr["metadata"]["name"]
    kind = "Approved" if decision.approve else "Denied"
    csr = json.loads(json.dumps(csr))
    csr.setdefault("status", {}).setdefault("conditions", []).append({
        "type": kind, "status": "True", "reason": decision.reason, "message": decision.message,
        "lastUpdateTime": now()})
    stored = api.call("PUT", f"{CSR_PATH}/{urllib.parse.quote(name, safe='')}/approval", csr)
    log(csr=name, decision=kind, reason=decision.reason, message=decision.message)
    api.call("POST", "/api/v1/namespaces/default/events", {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": "default"},
        "involvedObject": {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "name": name,
                           "uid": csr["metadata"].get("uid", "")},
        "type": "Normal" if decision.approve else "Warning", "reason": decision.reason,
        "message": decision.message[:1024], "source": {"component": COMPONENT},
        "firstTimestamp": now(), "lastTimestamp": now(), "count": 1,
    })
    return stored if stored.get("metadata") else csr


class Approver:
    """What the watches say (the kubelet client requests; the nodes without a pool label),
    and the writes that follow from it, each once.

    Two watches (kube_watch.ListWatch) feed one loop: a request is decided when it
    appears, a node is labelled when it registers (or when the request that names its
    pool is approved). The node list at start and at each resync reads every node, so a
    label changed by hand is put right within the resync; between them only unlabelled
    nodes are watched.
    """

    def __init__(self, api: Api, config: dict, clock=SystemClock, rng: random.Random | None = None,
                 membership: CloudMembership | None = None) -> None:
        self.api, self.config, self.clock = api, config, clock
        self.membership = membership or CloudMembership(config)
        self.rng = rng or random.Random()
        self.inbox = clock.queue()
        self.stopped = False
        self.csrs: dict[str, dict] = {}          # kubelet client requests by name
        self.csrs_synced = False
        self.approved: dict[str, str] | None = None   # node name -> pool, from self.csrs (None: to recompute)
        self.unlabelled: dict[str, dict] = {}    # nodes without the pool label, as last seen
        self.nodes_synced = False
        self.to_check: dict[str, dict] = {}      # nodes to bring to their labels at the next reconcile

    # -- what the watches say --------------------------------------------------------

    def take(self, item: tuple) -> None:
        pool_label = self.config["labels"]["pool"]
        if item[0] == "sync":
            _, kind, items = item
            if kind == "csrs":
                self.csrs = {c["metadata"]["name"]: c for c in items}
                self.csrs_synced, self.approved = True, None
            else:
                self.to_check = {n["metadata"]["name"]: n for n in items}
                self.unlabelled = {name: n for name, n in self.to_check.items()
                                   if pool_label not in (n["metadata"].get("labels") or {})}
                self.nodes_synced = True
            return
        _, kind, event_type, obj = item
        name = obj["metadata"]["name"]
        if kind == "csrs":
            if event_type == "DELETED":
                self.csrs.pop(name, None)
            else:
                self.csrs[name] = obj
            self.approved = None
        elif event_type == "DELETED":
            self.unlabelled.pop(name, None)
            self.to_check.pop(name, None)
        else:
            self.to_check[name] = obj
            if pool_label in (obj["metadata"].get("labels") or {}):
                self.unlabelled.pop(name, None)   # left the watch's selector
            else:
                self.unlabelled[name] = obj

    # -- writes, only of a difference -------------------------------------------------------

    def reconcile(self) -> None:
        if not self.csrs_synced:
            return
        for name in sorted(self.csrs):
            decision = decide(self.csrs[name], self.config, lambda node: node_exists(self.api, node),
                              self.membership)
            if decision is not None:
                self.csrs[name] = record(self.api, self.csrs[name], decision)
                self.approved = None
        if not self.nodes_synced:
            return
        if self.approved is None:
            # A request approved (by this or an earlier run) may name the pool of a
            # node waiting unlabelled: look at those again.
            self.approved = approved_pools(list(self.csrs.values()), self.config)
            self.to_check.update(self.unlabelled)
        for name in sorted(self.to_check):
            node = self.to_check[name]
            patch = label_patch(node, wanted_labels(node, self.config, self.approved))
            if patch:
                stored = self.api.call("PATCH", f"{NODES_PATH}/{urllib.parse.quote(name, safe='')}", patch,
                                       "application/merge-patch+json")
                log(node=name, labels=patch["metadata"]["labels"])
                if stored.get("metadata"):
                    self.take(("event", "nodes", "MODIFIED", stored))
            del self.to_check[name]

    # -- the loop ------------------------------------------------------------------------

    def deliver(self, item: tuple) -> None:
        self.inbox.put(item)

    def start_watches(self) -> None:
        resync = float(self.config.get("resync_seconds", 3600))
        # One relist per resync period, the two watches taking turns, the first at a
        # random point of the period (a restarted approver does not relist on the hour).
        first = self.clock.monotonic() + self.rng.uniform(0, resync)
        watches = [("csrs", CSR_PATH, CSR_SELECTOR, CSR_SELECTOR),
                   ("nodes", NODES_PATH, "", unlabelled_selector(self.config))]
        for turn, (kind, path, list_query, watch_query) in enumerate(watches):
            watch = ListWatch(self.api, self.clock, self.rng, kind, path, list_query=list_query,
                              watch_query=watch_query, deliver=self.deliver, stopped=lambda: self.stopped,
                              resync_at=first + turn * resync, resync_seconds=resync * len(watches), name=COMPONENT)
            self.clock.spawn(watch.run)

    def stop(self) -> None:
        self.stopped = True
        self.inbox.put(STOP)

    def run(self) -> None:
        self.start_watches()
        retry_at: float | None = None
        while True:
            timeout = None if retry_at is None else max(0.0, retry_at - self.clock.monotonic())
            for item in take_waiting(self.inbox, timeout):
                if item == STOP:
                    return
                self.take(item)
            try:
                self.reconcile()
                retry_at = None
            except API_ERRORS as err:
                # A 409 from a lost race (the watch brings the winner's write), an API
                # server away: tried again after a jittered pause, or at the next event.
                log(error=f"{type(err).__name__}: {err}")
                retry_at = self.clock.monotonic() + self.rng.uniform(*RETRY_SECONDS)


STOP = ("stop",)


def once(api: Api, config: dict, membership: CloudMembership | None = None) -> None:
    """One pass from consistent reads (`--once`: debugging, tests): the loop's decisions and writes."""
    approver = Approver(api, config, membership=membership)
    approver.take(("sync", "csrs", api.call("GET", f"{CSR_PATH}?{CSR_SELECTOR}").get("items", [])))
    approver.take(("sync", "nodes", api.call("GET", NODES_PATH).get("items", [])))
    approver.reconcile()


def main(argv: list[str]) -> int:
    path = os.environ.get("CORRAL_NODE_APPROVER_CONFIG",
                          os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json"))
    with open(path) as fh:
        config = json.load(fh)
    api = Api()
    if argv[1:] == ["--once"]:
        try:
            once(api, config)
            return 0
        except API_ERRORS as err:
            log(error=f"{type(err).__name__}: {err}")
            return 1
    Approver(api, config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
