"""The typed cluster definition: what one `clusters/<name>.yaml` may say.

Field names are snake_case in Python and camelCase in YAML (the contract in
the README); a few keys keep their upper-case acronyms (podCIDR, sizeGiB).
Per-field checks live here; rules that relate fields to each other or to the
rest of the fleet live in `rules.py`, so each message can name the field it
is about. Size-dependent defaults are filled in `Cluster._resolve_defaults`,
and `corral show` prints the result.
"""

from __future__ import annotations

import ipaddress
import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from . import hosts as hostnames
from .containerd import DEFAULT_CONTAINERD, package_version
from .disks import DEFAULT_DISK_TYPE, DISK_TYPES, default_throughput, etcd_iops_floor
from .gpu_catalog import GPU_MODELS, closest, gpu_machine
from .mtu import DEFAULT_FLANNEL_MTU, flannel_mtu_limit

API_VERSION = "corral.dev/v1"
Cloud = Literal["azure", "aws", "gcp"]
CLOUDS: tuple[str, ...] = ("azure", "aws", "gcp")
PROVIDERS: tuple[str, ...] = ("onprem", *CLOUDS)

# Labels corral puts on every node; users' own labels go beside them.
LABEL_DOMAIN = "corral.dev"
# Far above any real cluster (Kubernetes is tested to 5,000 nodes; OpenAI ran
# 7,500), low enough that expanding every host name stays cheap.
MAX_ONPREM_HOSTS = 100_000
TEAM_TAINT_KEY = f"{LABEL_DOMAIN}/team"
# GPU health (docs/gpu-health.md): new GPU nodes register behind the preflight
# taint; the health agent removes it when the node's checks pass, and puts the
# unhealthy taint on nodes whose GPUs or links fail later.
PREFLIGHT_TAINT_KEY = f"{LABEL_DOMAIN}/preflight"
UNHEALTHY_TAINT_KEY = f"{LABEL_DOMAIN}/unhealthy"


class Spec(BaseModel):
    """Base of every section: camelCase keys, unknown keys rejected."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        str_strip_whitespace=False,
    )


# --- Free text: strict shapes ------------------------------------------------
#
# Values of the cluster file reach shell scripts, systemd units, Ansible
# variables and cloud APIs. Every free-text field therefore has a shape that
# holds no newline, quote, '{{', '$' or other shell metacharacter. Patterns
# end with \Z, not $: `$` also matches before a trailing newline. The JSON
# Schema gets the same pattern in ECMA-262 form (`^...$`, where `$` is the end
# of the text), which editors check while one types.


def shown(value: str, limit: int = 60) -> str:
    """A value quoted for a one-line message: control characters escaped, long text cut."""
    text = value if len(value) <= limit else value[:limit] + "..."
    if text.isprintable():
        return f"'{text}'"
    return repr(text)


def _ecma(regex: str) -> str:
    assert regex.endswith(r"\Z"), regex
    return "^" + regex[: -len(r"\Z")] + "$"


def strict_text(regex: str, what: str, max_length: int, example: str | None = None):
    """A str type: at most `max_length` characters matching `regex` (which ends with `\\Z`)."""
    compiled = re.compile(regex)
    like = f" (like {example})" if example else ""

    def check(value: str) -> str:
        if len(value) > max_length or not compiled.match(value):
            raise ValueError(f"{shown(value)} must be {what}, at most {max_length} characters{like}")
        return value

    return Annotated[
        str,
        AfterValidator(check),
        WithJsonSchema({"type": "string", "pattern": _ecma(regex), "maxLength": max_length}),
    ]


# Kubernetes names, as the API server checks them.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")


def check_label_key(key: str) -> str:
    """A label or taint key: `[prefix/]name`, as apimachinery's IsQualifiedName."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        raise ValueError(f"label key {shown(key)} has more than one '/'")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise ValueError(
            f"label key prefix {shown(prefix)} must be a DNS subdomain (lower-case, at most 253 characters)"
        )
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        raise ValueError(
            f"label key {shown(key)}: the name part must be 1-63 characters of letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    return key


def check_label_value(value: str) -> str:
    if value and (len(value) > 63 or not _QUALIFIED_NAME.match(value)):
        raise ValueError(
            f"label value {shown(value)} must be at most 63 characters of letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit"
        )
    return value


def check_dns_label(value: str) -> str:
    if len(value) > 40 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{shown(value)} must be a lower-case name of letters, digits and '-', at most 40 characters"
        )
    return value


# Networks private to an organisation: RFC 1918, RFC 6598 (carrier-grade NAT,
# 100.64.0.0/10) and IPv6 unique local addresses. Anything else is someone
# else's address space, or a typo (128.0.0.0/1 is half the internet).
PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
_CIDR_SHAPE = re.compile(r"[0-9A-Fa-f:.]{2,39}/[0-9]{1,3}\Z")


def check_cidr(value: str) -> str:
    if not _CIDR_SHAPE.match(value):
        raise ValueError(f"{shown(value)} is not a network in CIDR form (like 10.50.0.0/16)")
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as err:
        raise ValueError(f"{shown(value)} is not a network in CIDR form ({err})") from None
    return value


def is_private_network(cidr: str) -> bool:
    network = ipaddress.ip_network(cidr)
    return any(network.version == p.version and network.subnet_of(p) for p in PRIVATE_NETWORKS)


def check_private_cidr(value: str) -> str:
    check_cidr(value)
    if not is_private_network(value):
        raise ValueError(
            f"{value} is not a private network (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, "
            "100.64.0.0/10 or fc00::/7)"
        )
    return value


def _pattern_check(check):
    """A field validator that runs one of hosts.py's pattern checks on the value."""

    def validate(value: str) -> str:
        try:
            check(value)
        except hostnames.HostPatternError as err:
            raise ValueError(str(err)) from None
        return value

    return validate


check_host_pattern = _pattern_check(hostnames.check)
check_address_pattern = _pattern_check(hostnames.check_addresses)


def check_host_or_address(value: str) -> str:
    """One host, by DNS name or IP address (no ranges): a jump host."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if "[" in value:
        raise ValueError(f"{shown(value)}: a single host's name or address, not a range")
    try:
        hostnames.check(value)
    except hostnames.HostPatternError:
        raise ValueError(f"{shown(value)} is neither an IP address nor a host name "
                         "(lower-case letters, digits, '-' and '.')") from None
    return value


_KUBERNETES_VERSION = re.compile(r"1\.[0-9]{1,2}\.[0-9]{1,3}\Z")


def check_kubernetes_version(value: str) -> str:
    if not _KUBERNETES_VERSION.match(value):
        raise ValueError(f"{shown(value)} must be a full Kubernetes version like \"1.31.4\" (quoted)")
    return value


_CONTAINERD_VERSION = re.compile(r"[0-9]{1,2}\.[0-9]{1,3}\.[0-9]{1,3}\Z")


def check_containerd_version(value: str) -> str:
    if not _CONTAINERD_VERSION.match(value):
        raise ValueError(f"{shown(value)} must be a full containerd version like \"1.7.27\" (quoted)")
    return value


_NAME_JSON_SCHEMA = {"type": "string", "pattern": _ecma(_DNS_LABEL.pattern), "maxLength": 40}
LabelKey = Annotated[str, AfterValidator(check_label_key)]
LabelValue = Annotated[
    str, AfterValidator(check_label_value),
    WithJsonSchema({"type": "string", "pattern": "^(" + _ecma(_QUALIFIED_NAME.pattern)[1:-1] + ")?$",
                    "maxLength": 63}),
]
Name = Annotated[str, AfterValidator(check_dns_label), WithJsonSchema(_NAME_JSON_SCHEMA)]
_CIDR_JSON_SCHEMA = {"type": "string", "pattern": _ecma(_CIDR_SHAPE.pattern)}
Cidr = Annotated[str, AfterValidator(check_cidr), WithJsonSchema(_CIDR_JSON_SCHEMA)]
PrivateCidr = Annotated[str, AfterValidator(check_private_cidr), WithJsonSchema(_CIDR_JSON_SCHEMA)]
HostPattern = Annotated[str, AfterValidator(check_host_pattern)]
AddressPattern = Annotated[
    str, AfterValidator(check_address_pattern),
    WithJsonSchema({"type": "string", "pattern": "^[0-9A-Fa-f:.\\[\\]]{2,80}$"}),
]
HostOrAddress = Annotated[str, AfterValidator(check_host_or_address),
                          WithJsonSchema({"type": "string", "maxLength": 253})]
KubernetesVersion = Annotated[
    str, AfterValidator(check_kubernetes_version),
    WithJsonSchema({"type": "string", "pattern": _ecma(_KUBERNETES_VERSION.pattern)}),
]
ContainerdVersion = Annotated[
    str, AfterValidator(check_containerd_version),
    WithJsonSchema({"type": "string", "pattern": _ecma(_CONTAINERD_VERSION.pattern)}),
]

Region = strict_text(r"[a-z][a-z0-9-]*[a-z0-9]\Z", "a region name of lower-case letters, digits and '-'",
                     40, "eastus2, us-west-2")
Zone = strict_text(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z", "a zone name of lower-case letters, digits and '-'",
                   40, '"1", us-west-2a')
MachineType = strict_text(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z", "a machine type of letters, digits, '_', '.' and '-'",
                          64, "Standard_D32s_v5, m7i.8xlarge")
DiskType = strict_text(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z", "a disk type of letters, digits, '_' and '-'",
                       40, "gp3, PremiumV2_LRS")


def check_gpu_model(value: str) -> str:
    """One of the GPU models corral knows (gpu_catalog.GPU_MODELS): it becomes the
    corral.dev/gpu-model node label and is checked against cloud machine types."""
    if value not in GPU_MODELS:
        guess = closest(value, GPU_MODELS)
        hint = f"; did you mean {guess}?" if guess else ""
        raise ValueError(f"unknown GPU model {shown(value)}{hint} (known: {', '.join(GPU_MODELS)})")
    return value


GpuModel = Annotated[str, AfterValidator(check_gpu_model),
                     WithJsonSchema({"type": "string", "enum": list(GPU_MODELS)})]
DriverVersion = strict_text(r"[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?\Z", "an NVIDIA driver version", 14,
                            '"550.127.05"')
# Linux interface names: at most 15 bytes (IFNAMSIZ), no '/', no space.
InterfaceName = strict_text(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z", "a network interface name of letters, digits, "
                            "'_', '.' and '-'", 15, "ens1f0np0")
# Mirror and proxy URLs go into apt sources, apt.conf and systemd drop-ins:
# scheme, host, port and a plain path only (no credentials, query, '%' or quotes).
_URL_HOST = r"([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?"
MirrorUrl = strict_text(r"https?://" + _URL_HOST + r"(/[A-Za-z0-9._~+-]+)*/?\Z",
                        "an http(s) URL of a host, an optional port and a plain path (letters, digits, "
                        "'.', '_', '~', '+', '-'), no credentials or query", 200, "http://mirror.sf1.internal")
ProxyUrl = strict_text(r"https?://" + _URL_HOST + r"/?\Z",
                       "an http(s) URL of a proxy host and port, no credentials or path", 200,
                       "http://proxy.sf1.internal:3128")
# Where Prometheus remote-writes to (monitoring.remoteWrite): no credentials
# in the URL; those come from a Secret (monitoring.remoteWrite.secret).
RemoteWriteUrl = strict_text(r"https?://" + _URL_HOST + r"(/[A-Za-z0-9._~+-]+)*/?\Z",
                             "an http(s) URL of a host, an optional port and a plain path, no credentials "
                             "or query", 200, "https://metrics.example.internal/api/v1/push")
SecretKey = strict_text(r"[-._a-zA-Z0-9]+\Z", "a Secret key of letters, digits, '-', '_' and '.'", 253, "token")
# Prose for people; it reaches no script or template, but still holds no line
# break, control or bidirectional-override character, template or shell
# expansion ('{', '}', '$', '`', '\').
Description = strict_text(
    "[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u200b-\\u200f\\u202a-\\u202e\\u2066-\\u2069{}$`\\\\<>]*\\Z",
    "one line of text without control characters, '{', '}', '$', '`', '\\\\', '<' or '>'", 300,
)


def _parse_taint(value: object) -> object:
    """Taints may be written as `key=value:Effect` strings, as kubectl prints them."""
    if not isinstance(value, str):
        return value
    body, sep, effect = value.rpartition(":")
    if not sep:
        raise ValueError(f"taint '{value}' must look like key=value:Effect or key:Effect")
    key, _, val = body.partition("=")
    return {"key": key, "value": val, "effect": effect}


class Taint(Spec):
    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


TaintSpec = Annotated[Taint, BeforeValidator(_parse_taint, json_schema_input_type=Union[str, Taint])]


# --- Sections ---------------------------------------------------------------


class KubernetesSpec(Spec):
    version: KubernetesVersion
    pod_cidr: PrivateCidr = Field("10.128.0.0/14", alias="podCIDR")
    service_cidr: PrivateCidr = Field("10.96.0.0/16", alias="serviceCIDR")
    # The containerd every node runs, as Docker's containerd.io package (the
    # distributions' are too old: corral/model/containerd.py); rules.py checks
    # it against containerd's minimum for `version`.
    containerd: ContainerdVersion = Field(
        DEFAULT_CONTAINERD, description=f"containerd release (Docker's containerd.io), default {DEFAULT_CONTAINERD}",
    )

    @property
    def minor(self) -> str:
        """`1.31` of `1.31.4`: the apt repository track and API schema set."""
        return ".".join(self.version.split(".")[:2])

    @property
    def containerd_package_version(self) -> str:
        """The containerd.io package version to install (`1.7.27-1`); the rules refuse versions without one."""
        return package_version(self.containerd)


class ApiServers(Spec):
    count: int = Field(3, ge=1, le=9)
    machine_type: MachineType


class EtcdDisk(Spec):
    type: DiskType | None = None
    size_gib: int = Field(256, ge=1, alias="sizeGiB")
    iops: int | None = Field(None, ge=1)
    throughput_mbps: int | None = Field(None, ge=1, alias="throughputMBps")


class EtcdSnapshots(Spec):
    """Scheduled snapshots to the cluster's object storage (docs/etcd.md)."""

    # etcd's guidance is "regularly"; kubeadm users typically take hourly to
    # daily ones. 30 minutes bounds what a restore loses; each snapshot is one
    # read of the whole database from one member (the leader).
    interval_minutes: int = Field(30, ge=5, le=1440, description="minutes between snapshots, 5..1440")
    # Old snapshots expire by the bucket's lifecycle rule (versions too).
    retention_days: int = Field(14, ge=1, le=3650, description="days a snapshot is kept, 1..3650")


class Etcd(Spec):
    # Odd, 3..7: rules.py says why; the bound here only keeps absurd values
    # from reaching the layout.
    members: int = Field(5, ge=1, le=99, description="odd, 3..7")
    machine_type: MachineType
    disk: EtcdDisk = EtcdDisk()
    # OpenAI's large clusters kept events in their own etcd cluster, so event
    # churn cannot slow down writes of everything else. Off unless the file
    # says so: a default that followed the node count would add or remove a
    # whole etcd cluster when a pool is resized.
    dedicated_events_cluster: bool = False
    # etcd's default quota is 2 GiB; large clusters raise it (8 GiB suggested max).
    quota_backend_gib: int = Field(8, ge=2, le=8, alias="quotaBackendGiB")
    snapshots: EtcdSnapshots = EtcdSnapshots()


class ControlPlane(Spec):
    cloud: Cloud
    region: Region
    zones: list[Zone] = Field(min_length=1)
    network_cidr: PrivateCidr = Field(alias="networkCIDR")
    api_servers: ApiServers
    etcd: Etcd


# --- How corral's controller reaches on-prem hosts (docs/onprem-hosts.md) -----
# They become Ansible's connection variables (ansible-core's ssh connection
# plugin: ansible_user, ansible_port, ansible_ssh_private_key_file,
# ansible_ssh_common_args) and ssh options; every shape here keeps ssh option
# syntax and shell metacharacters out.
SshUser = strict_text(r"[a-z_][a-z0-9_-]{0,31}\Z", "a user name of lower-case letters, digits, '_' and '-'",
                      32, "root, corral")
# A path on the operator's machine, never the key itself (a key pasted here
# would land in git); no leading '-', which ssh would read as an option.
KeyFile = strict_text(r"[A-Za-z0-9_~./+][A-Za-z0-9_~./+-]*\Z",
                      "a path to a private key file on the controller (letters, digits, '_', '~', '.', '/', "
                      "'+', '-'), never the key itself", 255, "~/.ssh/corral_sf1")


class JumpHost(Spec):
    """A bastion the controller's ssh connects through (`ssh -W`), itself host-key checked."""

    host: HostOrAddress
    user: SshUser | None = Field(None, description="default: the hosts' ssh user")
    port: int = Field(22, ge=1, le=65_535)


class Ssh(Spec):
    """ssh settings for a site's hosts; a pool's `ssh` overrides them key by key."""

    user: SshUser | None = Field(None, description="default: Ansible's remote user (the operator's own)")
    port: int | None = Field(None, ge=1, le=65_535, description="default: 22")
    private_key_file: KeyFile | None = Field(None, description="path on the controller; default: ssh's own")
    jump_host: JumpHost | None = None

    def over(self, defaults: Ssh) -> Ssh:
        """These settings, with what they leave out taken from `defaults`."""
        return Ssh.model_validate({**defaults.model_dump(exclude_none=True),
                                   **self.model_dump(exclude_none=True)})


class Vpn(Spec):
    peer_address: ipaddress.IPv4Address
    bgp_asn: int = Field(ge=1, le=4_294_967_295, alias="bgpASN")


class Site(Spec):
    name: Name
    cidrs: list[Cidr] = Field(min_length=1)
    # Site networks must be private (see PRIVATE_NETWORKS) unless this says
    # the site really routes public address space of its own.
    allow_public_cidrs: bool = Field(
        False, alias="allowPublicCIDRs",
        description="Allow site CIDRs outside the private ranges (RFC 1918, 100.64.0.0/10, fc00::/7).",
    )
    vpn: Vpn | None = None
    # Air-gapped data centres: base URL of the site's package mirror, and/or a
    # proxy the nodes use for apt.
    apt_mirror: MirrorUrl | None = None
    http_proxy: ProxyUrl | None = None
    # How the controller reaches the site's hosts (pools may override).
    ssh: Ssh = Ssh()


class Flannel(Spec):
    backend: Literal["vxlan", "host-gw", "wireguard", "ipip"] = "vxlan"
    direct_routing: bool = True
    # Pod interface MTU on every node (docs/addons.md, flannel MTU); unset:
    # 1450, or less where the cluster's paths carry less (mtu.py).
    mtu: int | None = Field(
        None, ge=1280, le=9000,
        description=f"pod MTU; default {DEFAULT_FLANNEL_MTU}, or the most the cloud NICs and site VPNs carry if less",
    )
    vni: int = Field(1, ge=1, le=16_777_215)
    port: int = Field(8472, ge=1, le=65_535)


# The kubelet's default maxPods (KubeletConfiguration reference, maxPods: 110).
PODS_PER_NODE = 110


class ArpCache(Spec):
    gc_thresh1: int = Field(ge=1)
    gc_thresh2: int = Field(ge=1)
    gc_thresh3: int = Field(ge=1)

    @staticmethod
    def working_set(node_capacity: int) -> int:
        """The neighbour entries a node really uses: with flannel direct routing
        every other node on its subnet (at most the whole cluster), plus its own
        pods on the bridge (the kubelet's default maxPods, 110)."""
        return node_capacity + PODS_PER_NODE

    @classmethod
    def for_nodes(cls, node_capacity: int) -> ArpCache:
        """Neighbour table sizes for a cluster of this many nodes.

        gc_thresh3 (the hard limit) and gc_thresh2 (where garbage collection
        turns aggressive): 16 entries per node, at least the
        kernel-default-beating 8,192 and at most OpenAI's 7,500-node figures
        (90,000 / 100,000), which a 6,250-node cluster reaches. gc_thresh1 is
        the number of entries the kernel never purges (ip-sysctl.rst: "Garbage
        collector will not purge entries if there are fewer than this
        number"): the working set, so stale entries above it are still
        collected - OpenAI's 80,000 kept every stale entry of a smaller cluster.
        It is rounded up to a power of two, so resizing a pool does not change
        every node's sysctls (and with them every cloud pool's user data).
        """
        high = max(8_192, min(100_000, 16 * node_capacity))
        working_set = 1 << (cls.working_set(node_capacity) - 1).bit_length()
        return cls(gc_thresh1=min(working_set, high // 2), gc_thresh2=high * 9 // 10, gc_thresh3=high)


class Network(Spec):
    flannel: Flannel = Flannel()
    arp_cache: ArpCache | None = None


class Team(Spec):
    name: Name
    namespaces: list[Name] = Field(min_length=1)
    reserved_pools: list[Name] = []


class Scheduling(Spec):
    bin_packing: bool = True
    # Gang scheduling of MPI jobs with scheduler-plugins' Coscheduling.
    coscheduling: bool = False
    teams: list[Team] = []


class Gpu(Spec):
    model: GpuModel
    count: int = Field(ge=1, le=16)
    driver: DriverVersion | None = None
    fabric_manager: bool = False


# The extended resource the shared RDMA device plugin advertises for a RoCE
# pool's HCAs (github.com/Mellanox/k8s-rdma-shared-dev-plugin): its resource
# prefix `rdma` (the plugin's default) and a resource name, which the plugin
# takes as [a-zA-Z0-9_]+ and Kubernetes as a qualified name (alphanumeric at
# both ends). Lower-case only here: the name also names the plugin's DaemonSet.
RdmaResource = strict_text(
    r"rdma/[a-z0-9]([a-z0-9_]*[a-z0-9])?\Z",
    "'rdma/' and a name of lower-case letters, digits and '_' (starting and ending with a letter or digit)",
    45, "rdma/roce",
)
DEFAULT_RDMA_RESOURCE = "rdma/roce"


class Roce(Spec):
    interfaces: list[InterfaceName] = Field(min_length=1)
    mtu: int = Field(9000, ge=1280, le=9216)
    pfc_priority: int = Field(3, ge=0, le=7)
    dscp: int = Field(26, ge=0, le=63)
    ecn: bool = True
    # What a pod requests (`rdma/roce: 1`) to open the pool's HCAs
    # (docs/addons.md, "RDMA for pods"). Pools that share one resource share
    # its traffic class (rules.py), which the admission policy holds pods to.
    rdma_resource: RdmaResource = Field(
        DEFAULT_RDMA_RESOURCE,
        description=f"extended resource of the pool's HCAs (shared RDMA device plugin), default {DEFAULT_RDMA_RESOURCE}",
    )

    @property
    def traffic_class(self) -> int:
        """The RoCE v2 traffic class (IP ToS byte) of the pool's lossless class:
        DSCP in the upper six bits, ECT(0) ('10', RFC 3168 section 5) in the two
        ECN bits when ECN is on. DSCP 26 with ECN: 106. What NCCL_IB_TC must be."""
        return self.dscp << 2 | (0b10 if self.ecn else 0)


# Xid classes: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html) as corral/health/classify.py's XID_CATALOG
# classifies it (tests/health/test_classify.py holds these equal to it; the
# model may not import the health package). Fatal: the catalog's immediate
# action is a GPU reset or a power cycle, so the GPU's jobs are lost and pods
# are evicted (NoExecute). Degraded: the job may go on, but no new work until
# a reset (NoSchedule). Others (13, 31, 43, 45, 109: the job's own faults)
# are counted, not acted on.
DEFAULT_FATAL_XIDS = (46, 48, 62, 64, 74, 79, 95, 110, 119, 120, 136, 140, 143, 155, 156, 158)
DEFAULT_DEGRADED_XIDS = (61, 63, 92, 94)


class Preflight(Spec):
    # GPU pools' nodes register with corral.dev/preflight=pending:NoSchedule
    # and run the node check (GPUs, ECC, fabric manager, burn, RoCE links).
    enabled: bool = True
    # `dcgmi diag -r 1` when DCGM is installed (about a minute); skipped with
    # a note where it is not.
    burn: bool = True
    # Expected RDMA link rate of RoCE interfaces, Gb/s; unset: only ACTIVE and MTU are checked.
    roce_link_gbps: int | None = Field(None, ge=1, le=3200, alias="roceLinkGbps")


class XidPolicy(Spec):
    fatal: list[int] = Field(default_factory=lambda: list(DEFAULT_FATAL_XIDS))
    degraded: list[int] = Field(default_factory=lambda: list(DEFAULT_DEGRADED_XIDS))

    @model_validator(mode="after")
    def _disjoint(self) -> XidPolicy:
        both = sorted(set(self.fatal) & set(self.degraded))
        if both:
            raise ValueError(f"Xid {', '.join(map(str, both))} listed as both fatal and degraded")
        if any(not 0 < x < 1000 for x in self.fatal + self.degraded):
            raise ValueError("Xid codes are numbers from 1 to 999")
        return self


class Remediation(Spec):
    # What `corral nodes health --remediate` does to an unhealthy node:
    # on-prem, reboot it and re-run the preflight (Ansible); cloud, delete
    # the instance so its group replaces it. `none`: only report.
    onprem: Literal["reboot", "none"] = "reboot"
    cloud: Literal["replace", "none"] = "replace"
    # Never more than this share of a pool's nodes out at once (at least one node).
    max_unavailable_percent: int = Field(10, ge=1, le=100)
    # Failure budget: a run stops once this many nodes did not come back
    # healthy (drain refused, no reboot, preflight failed, instance not
    # deleted); the rest are held for a person. Something systematic (a bad
    # driver, a PDB) must not cycle through the whole pool.
    max_failed_nodes: int = Field(1, ge=1, le=1000)


class ActiveChecks(Spec):
    # On idle GPU nodes (no pod holds a GPU), every intervalHours: a DCGM
    # diagnostic (`dcgmi diag -r dcgmLevel`) and, where nccl-tests is
    # installed on the host, a one-node all_reduce_perf. A failure taints the
    # node corral.dev/unhealthy (NoSchedule) until a reboot and preflight.
    enabled: bool = True
    interval_hours: int = Field(24, ge=1, le=720)
    dcgm_level: Literal[1, 2, 3] = 2
    # Minimum all_reduce_perf bus bandwidth, GB/s; unset: only a failed run counts.
    nccl_min_bus_gbps: float | None = Field(None, gt=0, le=10_000, alias="ncclMinBusGBps")


class Health(Spec):
    preflight: Preflight = Preflight()
    active: ActiveChecks = ActiveChecks()
    xid: XidPolicy = XidPolicy()
    # Fatal faults evict pods (NoExecute); false: NoSchedule for every fault.
    evict_on_fatal: bool = True
    remediation: Remediation = Remediation()


class SecretReference(Spec):
    """A key of a Secret in the monitoring namespace, created by an admin (never by corral)."""

    name: Name
    key: SecretKey


class RemoteWrite(Spec):
    url: RemoteWriteUrl
    # Bearer token for the receiver; mounted into Prometheus, never in a manifest or plan.
    secret: SecretReference | None = None


class Monitoring(Spec):
    """The monitoring add-on (docs/monitoring.md): how long Prometheus keeps data and where."""

    retention_days: int = Field(15, ge=1, le=400)
    # PersistentVolumes' storage class; unset: the cluster's default class.
    storage_class: Name | None = None
    # Prometheus shards, each scraping its share of the nodes; unset: one per
    # 1,000 nodes of the cluster's capacity (corral/manifests/monitoring.py).
    shards: int | None = Field(None, ge=1, le=64)
    remote_write: RemoteWrite | None = None


class PoolBase(Spec):
    name: Name
    gpu: Gpu | None = None
    labels: dict[LabelKey, LabelValue] = {}
    taints: list[TaintSpec] = []


class OnPremPool(PoolBase):
    provider: Literal["onprem"]
    site: Name
    hosts: list[HostPattern] = Field(min_length=1)
    # Addresses for hosts without DNS: entry j gives the addresses of hosts
    # entry j, in the same range syntax and count (`10.50.1.[11:74]` beside
    # `gpu-[001:064].sf1.internal`); a null entry: those hosts by name.
    addresses: list[AddressPattern | None] | None = Field(
        None, description="one per hosts entry: its hosts' IP addresses (same count), or null to use names",
    )
    ssh: Ssh | None = Field(None, description="overrides the site's ssh settings key by key")
    roce: Roce | None = None

    @cached_property
    def host_names(self) -> list[str]:
        return [h for pattern in self.hosts for h in hostnames.expand(pattern)]

    @cached_property
    def host_addresses(self) -> dict[str, str]:
        """Host name -> the address the controller connects to, for hosts given one.

        Assumes the rules passed (each addresses entry expands to as many
        addresses as its hosts entry has names).
        """
        pairs: dict[str, str] = {}
        for names, addresses in zip(self.hosts, self.addresses or []):
            if addresses is not None:
                pairs.update(zip(hostnames.expand(names), hostnames.expand_addresses(addresses)))
        return pairs

    @property
    def capacity(self) -> int:
        return sum(hostnames.count(p) for p in self.hosts)


class CloudPool(PoolBase):
    provider: Cloud
    machine_type: MachineType
    zones: list[Zone] | None = None  # default: the control plane's zones
    min_size: int = Field(0, ge=0)
    max_size: int = Field(ge=0, le=100_000)
    disk_size_gib: int = Field(200, ge=30, le=4096, alias="diskSizeGiB")
    spot: bool = False

    @property
    def capacity(self) -> int:
        return self.max_size


NodePool = Annotated[Union[OnPremPool, CloudPool], Field(discriminator="provider")]


class Cluster(Spec):
    api_version: Literal["corral.dev/v1"] = Field(alias="apiVersion")
    kind: Literal["Cluster"]
    name: Name
    description: Description = ""
    kubernetes: KubernetesSpec
    control_plane: ControlPlane
    sites: list[Site] = []
    network: Network = Network()
    scheduling: Scheduling = Scheduling()
    node_pools: list[NodePool] = []
    health: Health = Health()
    monitoring: Monitoring = Monitoring()
    # The file this cluster was read from (set by the loader; None when built in code).
    _source_file: Path | None = PrivateAttr(None)

    @field_validator("node_pools")
    @classmethod
    def _not_too_many_hosts(cls, pools: list) -> list:
        # Counted, not expanded: the rules expand every pattern, and a file
        # of many large patterns would otherwise take the validator's memory.
        hosts = sum(pool.capacity for pool in pools if isinstance(pool, OnPremPool))
        if hosts > MAX_ONPREM_HOSTS:
            raise ValueError(
                f"the on-prem pools name {hosts:,} hosts; a cluster may have at most {MAX_ONPREM_HOSTS:,}"
            )
        return pools

    @model_validator(mode="after")
    def _resolve_defaults(self) -> Cluster:
        """Fill what the file leaves out from the rest of the cluster."""
        nodes = self.node_capacity
        if self.network.arp_cache is None:
            self.network.arp_cache = ArpCache.for_nodes(nodes)
        flannel = self.network.flannel
        if flannel.mtu is None:
            limit, _ = flannel_mtu_limit(self.control_plane.cloud, self.vpn_site_names, flannel.backend)
            flannel.mtu = max(1280, min(DEFAULT_FLANNEL_MTU, limit))
        etcd = self.control_plane.etcd
        disk = etcd.disk
        if disk.type is None:
            disk.type = DEFAULT_DISK_TYPE[self.control_plane.cloud]
        kind = DISK_TYPES.get(disk.type)
        if disk.iops is None:
            disk.iops = max(etcd_iops_floor(nodes), kind.iops[0] if kind else 0)
        if disk.throughput_mbps is None and kind is not None:
            disk.throughput_mbps = default_throughput(kind, disk.iops)
        for pool in self.cloud_pools:
            if pool.zones is None:
                pool.zones = list(self.control_plane.zones)
            # A GPU machine type brings its GPUs (docs/gpu-machines.md): a pool
            # that leaves gpu out gets the machine's, with fabric manager where
            # NVSwitch joins them. A declared block is checked by the rules.
            machine = gpu_machine(pool.provider, pool.machine_type)
            if machine is not None and pool.gpu is None:
                pool.gpu = Gpu(model=machine.gpu_model, count=machine.gpu_count,
                               fabric_manager=bool(machine.nvswitch))
        return self

    # --- Views the other layers use, so they agree on one meaning. ---------

    @property
    def onprem_pools(self) -> list[OnPremPool]:
        return [p for p in self.node_pools if isinstance(p, OnPremPool)]

    @property
    def cloud_pools(self) -> list[CloudPool]:
        return [p for p in self.node_pools if isinstance(p, CloudPool)]

    @property
    def node_capacity(self) -> int:
        """Most nodes the cluster can have: on-prem hosts plus cloud pool maxima."""
        return sum(p.capacity for p in self.node_pools)

    @property
    def gpu_capacity(self) -> int:
        return sum(p.capacity * p.gpu.count for p in self.node_pools if p.gpu)

    def pool(self, name: str) -> OnPremPool | CloudPool | None:
        return next((p for p in self.node_pools if p.name == name), None)

    def site(self, name: str) -> Site | None:
        return next((s for s in self.sites if s.name == name), None)

    @property
    def vpn_site_names(self) -> list[str]:
        """Sites joined over a VPN: pod traffic to them crosses its tunnel."""
        return [s.name for s in self.sites if s.vpn]

    @property
    def source_file(self) -> Path | None:
        return self._source_file

    @property
    def known_hosts_file(self) -> Path | None:
        """The on-prem hosts' ssh host keys, reviewed and committed beside the
        cluster file (`clusters/<name>.known_hosts`, written by `corral hosts trust`)."""
        # Absolute: ssh runs it from Ansible's working directory, not the operator's.
        return self._source_file.absolute().with_suffix(".known_hosts") if self._source_file else None

    def ssh_for(self, pool: OnPremPool) -> Ssh:
        """The ssh settings of a pool's hosts: the pool's, then its site's."""
        site = self.site(pool.site)
        defaults = site.ssh if site else Ssh()
        return pool.ssh.over(defaults) if pool.ssh else defaults

    def teams_reserving(self, pool_name: str) -> list[Team]:
        return [t for t in self.scheduling.teams if pool_name in t.reserved_pools]

    def node_labels(self, pool: OnPremPool | CloudPool) -> dict[str, str]:
        """Labels a pool's nodes register with (join and cloud pools alike)."""
        location = (
            f"onprem-{pool.site}" if isinstance(pool, OnPremPool)
            else f"{pool.provider}-{self.control_plane.region}"
        )
        labels = {
            f"{LABEL_DOMAIN}/cluster": self.name,
            f"{LABEL_DOMAIN}/pool": pool.name,
            f"{LABEL_DOMAIN}/provider": pool.provider,
            f"{LABEL_DOMAIN}/location": location,
        }
        if isinstance(pool, OnPremPool):
            labels[f"{LABEL_DOMAIN}/site"] = pool.site
            if pool.roce:
                labels[f"{LABEL_DOMAIN}/roce"] = "true"
        if pool.gpu:
            labels[f"{LABEL_DOMAIN}/gpu-model"] = pool.gpu.model
            labels[f"{LABEL_DOMAIN}/gpu-count"] = str(pool.gpu.count)
            # The NVIDIA device plugin's DaemonSet selects nodes by this label.
            labels["nvidia.com/gpu.present"] = "true"
        for team in self.teams_reserving(pool.name):
            labels[TEAM_TAINT_KEY] = team.name
        labels.update(pool.labels)
        return labels

    def node_taints(self, pool: OnPremPool | CloudPool) -> list[Taint]:
        """Taints a pool's nodes register with: its own plus team reservations."""
        taints = list(pool.taints)
        for team in self.teams_reserving(pool.name):
            taints.append(Taint(key=TEAM_TAINT_KEY, value=team.name, effect="NoSchedule"))
        if pool.gpu:
            # Keep CPU-only pods off GPU machines; the device plugin and GPU
            # pods tolerate it.
            taints.append(Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule"))
            if self.health.preflight.enabled:
                # Removed by the health agent once the node's GPU checks pass.
                taints.append(Taint(key=PREFLIGHT_TAINT_KEY, value="pending", effect="NoSchedule"))
        seen, unique = set(), []
        for taint in taints:
            if (taint.key, taint.effect) not in seen:
                seen.add((taint.key, taint.effect))
                unique.append(taint)
        return unique
