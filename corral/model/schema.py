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
from .auto_repair import AutoRepair
from .burn_in import BurnIn
from .containerd import package_version
from .versions import default_containerd, default_containerd_text
from .disks import DEFAULT_DISK_TYPE, DISK_TYPES, default_throughput, etcd_iops_floor
from .gpu_catalog import GPU_MODELS, closest, gpu_machine
from .kueue import Kueue
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
RackPattern = Annotated[
    str, AfterValidator(_pattern_check(hostnames.check_racks)),
    WithJsonSchema({"type": "string", "pattern": "^[a-z0-9\\[\\]:-]{1,80}$"}),
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
    """A Kubernetes taint a pool's nodes register with; also written `key=value:Effect`."""

    key: LabelKey = Field(
        description="Taint key, `[prefix/]name` as for labels: a DNS-subdomain prefix of at most 253 characters "
        "and a name of 1-63 letters, digits, '-', '_' or '.'.",
    )
    value: LabelValue = Field(
        "", description="Taint value, at most 63 letters, digits, '-', '_' or '.'; default empty.",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        description="NoSchedule, PreferNoSchedule or NoExecute (which also evicts pods already running that "
        "do not tolerate it, docs/gpu-health.md).",
    )

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


TaintSpec = Annotated[Taint, BeforeValidator(_parse_taint, json_schema_input_type=Union[str, Taint])]


# --- Sections ---------------------------------------------------------------


class KubernetesSpec(Spec):
    """The Kubernetes release every node runs, and the cluster's pod and service networks."""

    version: KubernetesVersion = Field(
        description='Kubernetes release, a full version in quotes like "1.31.4"; its minor picks the apt '
        "repository track and the API schemas the manifests are checked against.",
    )
    pod_cidr: PrivateCidr = Field(
        "10.128.0.0/14", alias="podCIDR",
        description="Pod network (flannel's Network), a private CIDR; every node takes a /24 of it, so it must "
        "hold the cluster's most nodes. Default 10.128.0.0/14.",
    )
    service_cidr: PrivateCidr = Field(
        "10.96.0.0/16", alias="serviceCIDR",
        description="Service (ClusterIP) network, a private CIDR; default 10.96.0.0/16.",
    )
    # The containerd every node runs, as Docker's containerd.io package (the
    # distributions' are too old: corral/model/containerd.py); rules.py checks
    # it against containerd's minimum for `version`. Its default is the catalog's
    # for the minor (corral/model/versions.py), filled in by _containerd_default.
    containerd: ContainerdVersion = Field(
        None,
        description="containerd release every node runs (Docker's containerd.io), a full version in quotes; at "
        "least containerd's minimum for the Kubernetes version (README). Default: the version catalog's for "
        f"the Kubernetes minor ({default_containerd_text()}; docs/versions.md).",
        json_schema_extra=lambda schema: schema.pop("default", None),
    )

    @model_validator(mode="before")
    @classmethod
    def _containerd_default(cls, data):
        if isinstance(data, dict) and "containerd" not in data:
            version = data.get("version")
            data = {**data, "containerd": default_containerd(version if isinstance(version, str) else "")}
        return data

    @property
    def minor(self) -> str:
        """`1.31` of `1.31.4`: the apt repository track and API schema set."""
        return ".".join(self.version.split(".")[:2])

    @property
    def containerd_package_version(self) -> str:
        """The containerd.io package version to install (`1.7.27-1`); the rules refuse versions without one."""
        return package_version(self.containerd)


class ApiServers(Spec):
    """The control plane's API server machines."""

    count: int = Field(
        3, ge=1, le=9,
        description="Number of API server machines, 1..9; default 3 (OpenAI's largest clusters ran 5, REFERENCE.md).",
    )
    machine_type: MachineType = Field(
        description="Machine type of the API servers in the control plane's cloud (like Standard_D32s_v5, "
        "m7i.8xlarge), checked against the cloud's naming.",
    )


class EtcdDisk(Spec):
    """Each etcd member's data disk, with provisioned IOPS (limits: corral/model/disks.py, from the vendors' docs)."""

    type: DiskType | None = Field(
        None,
        description="Provisioned-IOPS disk type of the control plane's cloud: gp3, io1 or io2 (AWS), PremiumV2_LRS "
        "or UltraSSD_LRS (Azure), pd-extreme, hyperdisk-extreme or hyperdisk-balanced (GCP). Default: gp3, "
        "PremiumV2_LRS or hyperdisk-balanced.",
    )
    size_gib: int = Field(
        256, ge=1, alias="sizeGiB",
        description="Disk size, GiB, within the disk type's range (gp3 up to 16,384, io2 up to 65,536); default 256.",
    )
    # Per-GiB limits: AWS EBS docs (ebs-volume-types, provisioned-iops: io2 "IOPS:GiB ratio of 1,000:1"),
    # Azure disks-types; the figures and links are in corral/model/disks.py.
    iops: int | None = Field(
        None, ge=1,
        description="Provisioned IOPS, within the disk type's range and per-GiB limit (gp3 and Premium SSD v2: "
        "500 per GiB, io2: 1,000), and at least etcd's floor for the cluster's size (3,000; 5,000 from 500 nodes; "
        "10,000 from 2,500). Default: that floor, or the type's minimum if higher.",
    )
    throughput_mbps: int | None = Field(
        None, ge=1, alias="throughputMBps",
        description="Provisioned throughput, MB/s, only for types that take one (gp3, PremiumV2_LRS, UltraSSD_LRS, "
        "hyperdisk-balanced), within the type's range and MB/s-per-IOPS limit. Default: the cloud's baseline "
        "(UltraSSD_LRS: 4 KiB writes at the provisioned IOPS).",
    )


class EtcdSnapshots(Spec):
    """Scheduled snapshots to the cluster's object storage (docs/etcd.md)."""

    # etcd's guidance is "regularly"; kubeadm users typically take hourly to
    # daily ones. 30 minutes bounds what a restore loses; each snapshot is one
    # read of the whole database from one member (the leader).
    interval_minutes: int = Field(
        30, ge=5, le=1440,
        description="Minutes between snapshots, 5..1440; only the etcd leader saves one (docs/etcd.md). Default 30.",
    )
    # Old snapshots expire by the bucket's lifecycle rule (versions too).
    retention_days: int = Field(
        14, ge=1, le=3650,
        description="Days a snapshot (old versions too) is kept before the bucket's lifecycle rule deletes it, "
        "1..3650; default 14.",
    )


class Etcd(Spec):
    """The control plane's dedicated etcd members (docs/etcd.md)."""

    # Odd, 3..7: rules.py says why; the bound here only keeps absurd values
    # from reaching the layout.
    members: int = Field(
        5, ge=1, le=99,
        description="Number of etcd members: odd, 3..7 (etcd's guidance; an even count adds no fault tolerance). "
        "Default 5.",
    )
    machine_type: MachineType = Field(
        description="Machine type of the etcd members in the control plane's cloud; on GCP its series must be "
        "able to attach the disk type.",
    )
    disk: EtcdDisk = Field(EtcdDisk(), description="Each member's data disk, with provisioned IOPS.")
    # OpenAI's large clusters kept events in their own etcd cluster, so event
    # churn cannot slow down writes of everything else. Off unless the file
    # says so: a default that followed the node count would add or remove a
    # whole etcd cluster when a pool is resized.
    dedicated_events_cluster: bool = Field(
        False,
        description="Keep Kubernetes events in an etcd cluster of their own (--etcd-servers-overrides=/events#...), "
        "so event churn cannot slow other writes (REFERENCE.md, OpenAI's large clusters). Default false.",
    )
    # etcd's default quota is 2 GiB; large clusters raise it (8 GiB suggested max).
    quota_backend_gib: int = Field(
        8, ge=2, le=8, alias="quotaBackendGiB",
        description="etcd's --quota-backend-bytes, GiB, 2..8: etcd's default is 2 GiB, 8 GiB its suggested "
        "maximum (docs/scale.md). Default 8.",
    )
    snapshots: EtcdSnapshots = Field(
        EtcdSnapshots(), description="How often the etcd leader snapshots to object storage, and for how long.",
    )


class ControlPlane(Spec):
    """Where the control plane runs: one cloud region, its API servers and etcd."""

    cloud: Cloud = Field(description="Cloud of the control plane: azure, aws or gcp; cloud pools use the same one.")
    region: Region = Field(
        description="Region of the control plane and the cloud pools (like eastus2, us-west-2), one the cloud "
        "has, with availability zones on Azure.",
    )
    zones: list[Zone] = Field(
        min_length=1,
        description='Zones the control plane spreads over (like "1", us-west-2a): 1 to 3, no repeats, in the '
        "region; cloud pools' default zones.",
    )
    network_cidr: PrivateCidr = Field(
        alias="networkCIDR",
        description="The cluster's cloud network (VPC or VNet), a private CIDR overlapping no other cloud or site "
        "network of the fleet (docs/fleet.md); its node subnets must hold the cloud pools' maxSize.",
    )
    api_servers: ApiServers = Field(description="The API server machines.")
    etcd: Etcd = Field(description="The dedicated etcd members.")


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

    host: HostOrAddress = Field(description="The bastion's DNS name or IP address (one host, not a range).")
    user: SshUser | None = Field(None, description="ssh user on the bastion; default: the hosts' ssh user.")
    port: int = Field(22, ge=1, le=65_535, description="ssh port of the bastion, 1..65535; default 22.")


class Ssh(Spec):
    """ssh settings for a site's hosts; a pool's `ssh` overrides them key by key."""

    user: SshUser | None = Field(
        None,
        description="ssh user on the hosts (lower-case, at most 32 characters); default: Ansible's remote user "
        "(the operator's own).",
    )
    port: int | None = Field(None, ge=1, le=65_535, description="ssh port of the hosts, 1..65535; default 22.")
    private_key_file: KeyFile | None = Field(
        None, description="Path to the private key on the controller, never the key itself; default: ssh's own.",
    )
    jump_host: JumpHost | None = Field(
        None, description="Bastion the controller's ssh connects through (ssh -W); unset: connect directly.",
    )

    def over(self, defaults: Ssh) -> Ssh:
        """These settings, with what they leave out taken from `defaults`."""
        return Ssh.model_validate({**defaults.model_dump(exclude_none=True),
                                   **self.model_dump(exclude_none=True)})


class Vpn(Spec):
    """The site-to-site VPN that joins a site to the cluster's cloud network."""

    peer_address: ipaddress.IPv4Address = Field(description="Public IPv4 address of the site's VPN gateway.")
    bgp_asn: int = Field(
        ge=1, le=4_294_967_295, alias="bgpASN",
        description="BGP AS number of the site's router, 1..4294967295.",
    )


class Site(Spec):
    """A data centre whose hosts join the cluster (docs/onprem-hosts.md)."""

    name: Name = Field(
        description="Site name (lower-case letters, digits and '-', at most 40 characters); pools name it, and "
        "its nodes are labelled corral.dev/site and corral.dev/location onprem-<name>.",
    )
    cidrs: list[Cidr] = Field(
        min_length=1,
        description="The site's networks, at least one: private unless allowPublicCIDRs, and overlapping no "
        "other site's or any cloud network of the fleet (the same site may be in several clusters, docs/fleet.md).",
    )
    # Site networks must be private (see PRIVATE_NETWORKS) unless this says
    # the site really routes public address space of its own.
    allow_public_cidrs: bool = Field(
        False, alias="allowPublicCIDRs",
        description="Allow site CIDRs outside the private ranges (RFC 1918, 100.64.0.0/10, fc00::/7); "
        "default false.",
    )
    vpn: Vpn | None = Field(
        None,
        description="The VPN to the cloud network; pod traffic crosses its tunnel, which limits the pod MTU. "
        "Unset: no VPN.",
    )
    # Air-gapped data centres: base URL of the site's package mirror, and/or a
    # proxy the nodes use for apt.
    apt_mirror: MirrorUrl | None = Field(
        None,
        description="Base URL of the site's package mirror, for air-gapped data centres (http(s), no "
        "credentials or query); unset: the public repositories.",
    )
    http_proxy: ProxyUrl | None = Field(
        None, description="Proxy the site's nodes use for apt (http(s) host and port, no credentials); unset: none.",
    )
    # How the controller reaches the site's hosts (pools may override).
    ssh: Ssh = Field(
        Ssh(), description="How the controller reaches the site's hosts; a pool's ssh overrides it key by key.",
    )


class Flannel(Spec):
    """The pod network: flannel (docs/addons.md, flannel)."""

    backend: Literal["vxlan", "host-gw", "wireguard", "ipip"] = Field(
        "vxlan",
        description="flannel backend; default vxlan. host-gw is refused: it sends pod traffic unencapsulated, "
        "which cloud networks drop (docs/addons.md).",
    )
    # flannel's Documentation/backends.md (VXLAN): DirectRouting routes to hosts
    # on the same subnet, VNI "On Linux, defaults to 1", Port "defaults to
    # kernel default, currently 8472".
    direct_routing: bool = Field(
        True,
        description="vxlan only: plain routes to peers on the same subnet, VXLAN to others (flannel docs, "
        "backends); applies to on-prem nodes, cloud nodes always encapsulate. Default true.",
    )
    # Pod interface MTU on every node (docs/addons.md, flannel MTU); unset:
    # 1450, or less where the cluster's paths carry less (mtu.py).
    mtu: int | None = Field(
        None, ge=1280, le=9000,
        description=f"Pod interface MTU, 1280..9000; default {DEFAULT_FLANNEL_MTU}, or the most the cloud NICs "
        "and site VPNs carry if less (docs/addons.md).",
    )
    vni: int = Field(
        1, ge=1, le=16_777_215,
        description="VXLAN identifier, 1..16777215; default 1, flannel's own on Linux (flannel docs, backends).",
    )
    port: int = Field(
        8472, ge=1, le=65_535,
        description="UDP port of VXLAN packets, which VPNs and firewalls must pass; default 8472, the Linux "
        "kernel's (flannel docs, backends).",
    )


# The kubelet's default maxPods (KubeletConfiguration reference, maxPods: 110).
PODS_PER_NODE = 110


class ArpCache(Spec):
    """Every node's neighbour (ARP) table sizes: net.ipv4.neigh.default.gc_thresh1..3 (kernel ip-sysctl.rst)."""

    gc_thresh1: int = Field(
        ge=1,
        description="Entries the kernel never purges, stale ones included; below gcThresh2 and at most twice a "
        "node's working set (nodes plus 110 pods). Default: the working set, rounded up to a power of two.",
    )
    gc_thresh2: int = Field(
        ge=1,
        description="Table size above which garbage collection turns aggressive; between gcThresh1 and "
        "gcThresh3. Default: 90% of gcThresh3.",
    )
    gc_thresh3: int = Field(
        ge=1,
        description="Hard limit of the table; above gcThresh2. Default: 16 entries per node, 8,192 to 100,000 "
        "(OpenAI's 7,500-node figure, REFERENCE.md).",
    )

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
    """The pod network and every node's neighbour table."""

    flannel: Flannel = Field(Flannel(), description="The pod network (flannel).")
    arp_cache: ArpCache | None = Field(
        None, description="Neighbour table sizes; unset: sized for the cluster's node count (`corral show`).",
    )


class Team(Spec):
    """A team: its namespaces and the pools reserved for it."""

    name: Name = Field(
        description="Team name; its reserved pools' nodes are labelled and tainted corral.dev/team=<name>.",
    )
    namespaces: list[Name] = Field(
        min_length=1,
        description="The team's namespaces, at least one, none another team's; each gets Pod Security labels and "
        "the tolerations of the team's pools (PodTolerationRestriction).",
    )
    reserved_pools: list[Name] = Field(
        [],
        description="Pools only this team's pods may use (tainted corral.dev/team=<name>:NoSchedule); a pool is "
        "reserved by one team at most. Default none.",
    )


class Scheduling(Spec):
    """How the scheduler places pods (docs/addons.md, scheduling)."""

    bin_packing: bool = Field(
        True,
        description="Pack pods onto as few machines as possible (NodeResourcesFit MostAllocated, weighted for "
        "cpu, memory and nvidia.com/gpu), so idle cloud machines can scale in. Default true.",
    )
    # Gang scheduling of MPI jobs with scheduler-plugins' Coscheduling.
    coscheduling: bool = Field(
        False,
        description="Gang scheduling of MPI jobs with scheduler-plugins' Coscheduling (PodGroup CRD); default false.",
    )
    teams: list[Team] = Field([], description="Teams, their namespaces and reserved pools; default none.")
    kueue: Kueue = Field(Kueue(), description="Kueue admission: team quotas, gangs, topology (docs/scheduling.md).")


class Gpu(Spec):
    """The GPUs of each machine of a pool (docs/gpu-machines.md)."""

    model: GpuModel = Field(
        description="GPU model from corral's catalog; the corral.dev/gpu-model node label, checked against cloud "
        "machine types.",
    )
    count: int = Field(
        ge=1, le=16, description="GPUs per machine, 1..16; a cloud machine type brings all of its GPUs.",
    )
    driver: DriverVersion | None = Field(
        None,
        description='NVIDIA driver version in quotes (like "550.127.05"), from NVIDIA\'s CUDA apt repository; '
        "required for on-prem GPU pools.",
    )
    fabric_manager: bool = Field(
        False,
        description="Install nvidia-fabricmanager (the driver's version), which NVSwitch systems (HGX, DGX) need; "
        "must fit the machine. Default false.",
    )


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
    """RoCE v2 host QoS of a pool's RDMA NICs (REFERENCE.md, from NVIDIA's and iproute2's docs)."""

    interfaces: list[InterfaceName] = Field(
        min_length=1, description="RDMA network interfaces (like ens1f0np0, at most 15 characters), at least one.",
    )
    mtu: int = Field(
        9000, ge=1280, le=9216,
        description="Ethernet MTU of the RoCE interfaces, 1280..9216; default 9000 (with RDMA MTU 4096).",
    )
    pfc_priority: int = Field(
        3, ge=0, le=7, description="Priority made lossless with PFC, 0..7; default 3.",
    )
    dscp: int = Field(
        26, ge=0, le=63, description="DSCP of RoCE traffic, mapped to the PFC priority, 0..63; default 26.",
    )
    ecn: bool = Field(
        True,
        description="ECN (DCQCN) on the lossless priority; default true. Traffic class: DSCP << 2, plus 2 with ECN "
        "(106 by default), what NCCL_IB_TC must be.",
    )
    # What a pod requests (`rdma/roce: 1`) to open the pool's HCAs
    # (docs/addons.md, "RDMA for pods"). Pools that share one resource share
    # its traffic class (rules.py), which the admission policy holds pods to.
    rdma_resource: RdmaResource = Field(
        DEFAULT_RDMA_RESOURCE,
        description=f"Extended resource a pod requests to open the pool's HCAs (shared RDMA device plugin, "
        f"docs/addons.md); pools sharing one share the traffic class. Default {DEFAULT_RDMA_RESOURCE}.",
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
# a reset (NoSchedule); 54 (auxiliary power) until a person fixes the machine.
# Xid 154 is fatal unless its text asks only for a drain (classify.py). Others
# (13, 31, 43, 45, 109: the job's own faults) are counted, not acted on.
DEFAULT_FATAL_XIDS = (46, 48, 62, 64, 74, 79, 95, 110, 119, 120, 136, 140, 143, 154, 155, 156, 158)
DEFAULT_DEGRADED_XIDS = (54, 61, 63, 92, 94)


class Preflight(Spec):
    """The node check a new GPU node passes before it takes work (docs/gpu-health.md)."""

    enabled: bool = Field(
        True,
        description="GPU pools' nodes register behind corral.dev/preflight=pending:NoSchedule, removed once the "
        "node check (GPUs, ECC, fabric manager, burn, RoCE links) passes. Default true.",
    )
    burn: bool = Field(
        True,
        description="Run `dcgmi diag -r 1` (about a minute) where DCGM is installed, skipped with a note where "
        "not; default true.",
    )
    roce_link_gbps: int | None = Field(
        None, ge=1, le=3200, alias="roceLinkGbps",
        description="Expected RDMA link rate of the RoCE interfaces, Gb/s, 1..3200; unset: only ACTIVE and MTU "
        "are checked.",
    )


class XidPolicy(Spec):
    """Which NVIDIA Xid errors taint a node, and how (docs/gpu-health.md, Xid classes)."""

    fatal: list[int] = Field(
        default_factory=lambda: list(DEFAULT_FATAL_XIDS),
        description="Xid codes (1..999) that need a GPU reset or power cycle: the node is tainted NoExecute "
        "(NoSchedule without evictOnFatal). Default: NVIDIA's Xid catalog.",
    )
    degraded: list[int] = Field(
        default_factory=lambda: list(DEFAULT_DEGRADED_XIDS),
        description="Xid codes (1..999) after which jobs may go on but no new work lands until a reset "
        "(NoSchedule); none also fatal. Default: NVIDIA's Xid catalog.",
    )

    @model_validator(mode="after")
    def _disjoint(self) -> XidPolicy:
        both = sorted(set(self.fatal) & set(self.degraded))
        if both:
            raise ValueError(f"Xid {', '.join(map(str, both))} listed as both fatal and degraded")
        if any(not 0 < x < 1000 for x in self.fatal + self.degraded):
            raise ValueError("Xid codes are numbers from 1 to 999")
        return self


class Remediation(Spec):
    """What `corral nodes health --remediate` does to unhealthy nodes, within a budget (docs/gpu-health.md)."""

    # What `corral nodes health --remediate` does to an unhealthy node:
    # on-prem, reboot it and re-run the preflight (Ansible); cloud, delete
    # the instance so its group replaces it. `none`: only report.
    onprem: Literal["reboot", "none"] = Field(
        "reboot",
        description="On-prem: reboot (drain, reboot, preflight again, with Ansible) or none (only report); "
        "default reboot.",
    )
    cloud: Literal["replace", "none"] = Field(
        "replace",
        description="Cloud: replace (delete the instance so its group replaces it) or none (only report; the repair "
        "controller then replaces nothing either: rma after a failed reboot); default replace.",
    )
    # Never more than this share of a pool's nodes out at once (at least one node).
    max_unavailable_percent: int = Field(
        10, ge=1, le=100,
        description="Most of a pool's nodes out at once, percent, 1..100 (at least one node); default 10.",
    )
    # Failure budget: a run stops once this many nodes did not come back
    # healthy (drain refused, no reboot, preflight failed, instance not
    # deleted); the rest are held for a person. Something systematic (a bad
    # driver, a PDB) must not cycle through the whole pool.
    max_failed_nodes: int = Field(
        1, ge=1, le=1000,
        description="A run stops once this many nodes did not come back healthy, 1..1000; the rest are held for "
        "a person. Default 1.",
    )


class ActiveChecks(Spec):
    """Periodic checks of idle GPU nodes (docs/gpu-health.md)."""

    # On idle GPU nodes (no pod holds a GPU), every intervalHours: a DCGM
    # diagnostic (`dcgmi diag -r dcgmLevel`) and, where nccl-tests is
    # installed on the host, a one-node all_reduce_perf. A failure taints the
    # node corral.dev/unhealthy (NoSchedule) until a reboot and preflight.
    enabled: bool = Field(
        True,
        description="On idle GPU nodes, a DCGM diagnostic and (where nccl-tests is installed) a one-node "
        "all_reduce_perf; a failure taints the node corral.dev/unhealthy. Default true.",
    )
    interval_hours: int = Field(24, ge=1, le=720, description="Hours between a node's checks, 1..720; default 24.")
    dcgm_level: Literal[1, 2, 3] = Field(
        2, description="`dcgmi diag -r` level, 1, 2 or 3; default 2 (about two minutes).",
    )
    nccl_min_bus_gbps: float | None = Field(
        None, gt=0, le=10_000, alias="ncclMinBusGBps",
        description="Minimum all_reduce_perf bus bandwidth, GB/s, up to 10,000; unset: only a failed run counts.",
    )


class Health(Spec):
    """GPU node health: preflight, active checks, Xid policy and remediation (docs/gpu-health.md)."""

    preflight: Preflight = Field(Preflight(), description="The node check new GPU nodes pass before taking work.")
    active: ActiveChecks = Field(ActiveChecks(), description="Periodic checks of idle GPU nodes.")
    burn_in: BurnIn = Field(BurnIn(), description="The burn-in new and repaired GPU nodes pass before taking work.")
    xid: XidPolicy = Field(XidPolicy(), description="Which Xid errors are fatal and which degraded.")
    evict_on_fatal: bool = Field(
        True, description="Fatal faults evict pods (NoExecute); false: NoSchedule for every fault. Default true.",
    )
    remediation: Remediation = Field(
        Remediation(), description="What `corral nodes health --remediate` does, and its budget.",
    )
    auto_repair: AutoRepair = Field(AutoRepair(), description="The in-cluster repair controller and its budgets.")


class SecretReference(Spec):
    """A key of a Secret in the monitoring namespace, created by an admin (never by corral)."""

    name: Name = Field(description="Name of the Secret in the corral-monitoring namespace.")
    key: SecretKey = Field(description="Key of the Secret that holds the value.")


class RemoteWrite(Spec):
    """Where every Prometheus remote-writes its samples (docs/monitoring.md)."""

    url: RemoteWriteUrl = Field(
        description="Receiver URL: http(s), a host, an optional port and a plain path; no credentials or query.",
    )
    secret: SecretReference | None = Field(
        None,
        description="Bearer token for the receiver, mounted into Prometheus, never in a manifest or plan; "
        "unset: no token.",
    )


class Monitoring(Spec):
    """The monitoring add-on (docs/monitoring.md): how long Prometheus keeps data and where."""

    retention_days: int = Field(
        15, ge=1, le=400,
        description="Days Prometheus keeps data (--storage.tsdb.retention.time; its volume is sized from it), "
        "1..400; default 15.",
    )
    storage_class: Name | None = Field(
        None, description="Storage class of Prometheus' PersistentVolumes; unset: the cluster's default class.",
    )
    # corral/manifests/monitoring.py sizes the default.
    shards: int | None = Field(
        None, ge=1, le=64,
        description="Prometheus shards, each scraping its share of the nodes, 1..64; unset: one per 1,000 nodes "
        "of the cluster's capacity.",
    )
    remote_write: RemoteWrite | None = Field(
        None, description="Remote write of every Prometheus' samples; unset: none.",
    )


class PoolBase(Spec):
    name: Name = Field(description="Pool name, unique in the cluster; the corral.dev/pool node label.")
    gpu: Gpu | None = Field(
        None,
        description="The machines' GPUs; unset on a cloud pool of a GPU machine type: the machine's "
        "(docs/gpu-machines.md).",
    )
    labels: dict[LabelKey, LabelValue] = Field(
        {},
        description="More node labels; not the corral.dev/ labels corral sets, nor nvidia.com/ ones on a pool "
        "without gpu. Default none.",
    )
    taints: list[TaintSpec] = Field(
        [],
        description="More node taints, as {key, value, effect} or `key=value:Effect`; corral adds the team, GPU "
        "and preflight taints. Default none.",
    )


class OnPremPool(PoolBase):
    """Hosts of a site that join the cluster with `corral join` (Ansible)."""

    provider: Literal["onprem"] = Field(description="onprem: the pool's hosts are in one of the cluster's sites.")
    site: Name = Field(description="Name of the site (sites[].name) the hosts are in.")
    hosts: list[HostPattern] = Field(
        min_length=1,
        description="Host names, with Ansible-style ranges (gpu-[001:064].sf1.internal is 64 hosts), at least "
        "one; a host is in one pool only.",
    )
    # Addresses for hosts without DNS: entry j gives the addresses of hosts
    # entry j, in the same range syntax and count (`10.50.1.[11:74]` beside
    # `gpu-[001:064].sf1.internal`); a null entry: those hosts by name.
    addresses: list[AddressPattern | None] | None = Field(
        None,
        description="One per hosts entry: its hosts' IP addresses in the same range syntax and count, or null "
        "to reach those hosts by name; unset: every host by name.",
    )
    racks: list[RackPattern] | None = Field(
        None,
        description="One per hosts entry: the racks its hosts are in, in the same range syntax (sf1-r[01:08] "
        "beside gpu-[001:064].sf1.internal: 8 racks of 8 hosts, in order); the count must divide the hosts "
        "evenly. Each node gets the label corral.dev/rack, Kueue's topology level; unset: no rack labels.",
    )
    ssh: Ssh | None = Field(None, description="Overrides the site's ssh settings key by key; unset: the site's.")
    roce: Roce | None = Field(None, description="RoCE v2 host QoS of the hosts' RDMA NICs; unset: no RoCE.")

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

    @cached_property
    def host_racks(self) -> dict[str, str]:
        """Host name -> its rack: from `racks` (each rack an equal run of its
        hosts entry's hosts, in order), or every host in the one rack a pool
        without racks names in its corral.dev/rack label; else {}. Assumes the rules passed."""
        if self.racks is None:
            rack = self.labels.get(hostnames.RACK_LABEL)
            return dict.fromkeys(self.host_names, rack) if rack else {}
        racks: dict[str, str] = {}
        for names, rack_pattern in zip(self.hosts, self.racks or []):
            racks.update(hostnames.assign_racks(hostnames.expand(names), hostnames.expand_racks(rack_pattern)))
        return racks

    @property
    def capacity(self) -> int:
        return sum(hostnames.count(p) for p in self.hosts)


class CloudPool(PoolBase):
    """An autoscaled group of cloud machines (ASG, VMSS or MIG) in the control plane's region (docs/cloud-nodes.md)."""

    provider: Cloud = Field(description="Cloud of the pool: the control plane's.")
    machine_type: MachineType = Field(
        description="Machine type (like Standard_D64s_v5, m7i.8xlarge), checked against the cloud's naming; a "
        "GPU machine type brings its GPUs (docs/gpu-machines.md).",
    )
    zones: list[Zone] | None = Field(None, description="Zones the pool spreads over; default: the control plane's.")
    min_size: int = Field(
        0, ge=0,
        description="Fewest machines, at most maxSize; 0 lets the autoscaler scale the pool to zero. Default 0.",
    )
    max_size: int = Field(
        ge=0, le=100_000,
        description="Most machines the autoscaler may run, 0..100000; counts toward the cluster's node capacity.",
    )
    disk_size_gib: int = Field(
        200, ge=30, le=4096, alias="diskSizeGiB", description="Each machine's root disk, GiB, 30..4096; default 200.",
    )
    spot: bool = Field(False, description="Spot (preemptible) machines; default false.")

    @property
    def capacity(self) -> int:
        return self.max_size


NodePool = Annotated[Union[OnPremPool, CloudPool], Field(discriminator="provider")]


class Cluster(Spec):
    """One cluster: clusters/<name>.yaml (README, the cluster file)."""

    api_version: Literal["corral.dev/v1"] = Field(alias="apiVersion", description="Always corral.dev/v1.")
    kind: Literal["Cluster"] = Field(description="Always Cluster.")
    name: Name = Field(
        description="Cluster name (lower-case letters, digits and '-', at most 40 characters); the "
        "corral.dev/cluster node label.",
    )
    description: Description = Field(
        "",
        description="One line for people, at most 300 characters, without control characters, '{', '}', '$', "
        "'`', '\\', '<' or '>'; default empty.",
    )
    kubernetes: KubernetesSpec = Field(description="Kubernetes release and the pod and service networks.")
    control_plane: ControlPlane = Field(description="Cloud, region, API servers and etcd of the control plane.")
    sites: list[Site] = Field([], description="Data centres whose hosts join the cluster; default none.")
    network: Network = Field(Network(), description="The pod network and the nodes' neighbour tables.")
    scheduling: Scheduling = Field(Scheduling(), description="Bin packing, gang scheduling and teams.")
    node_pools: list[NodePool] = Field(
        [], description="Groups of nodes: on-prem hosts or autoscaled cloud machines; default none.",
    )
    health: Health = Field(Health(), description="GPU node health checks and remediation.")
    monitoring: Monitoring = Field(Monitoring(), description="The monitoring add-on (Prometheus).")
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
