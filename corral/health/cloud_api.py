"""An in-cluster cloud client: is node N an instance of this pool's groups, and replace one.

Standard library only. It runs in pods on the stock Python image (the node
approver, corral/certs/node_approver.py, ships it beside itself in its
ConfigMap; the repair controller, corral/health/repair/, imports it), so no
boto3, google-cloud or azure SDK. Credentials are the machine's own, from its
instance metadata service, which the pod reaches only with host networking
(pods are cut off from 169.254.169.254: corral/machine/metadata_block.py;
AWS's IMDSv2 hop limit of 1 besides):

  AWS    IMDSv2: PUT /latest/api/token (header X-aws-ec2-metadata-token-ttl-
         seconds), then GET /latest/meta-data/iam/security-credentials/ (the
         role's name) and .../<role> (AccessKeyId, SecretAccessKey, Token,
         Expiration), every GET with X-aws-ec2-metadata-token (EC2 User Guide,
         "Use the Instance Metadata Service", and the same calls in
         corral/templates/scripts/fetch-secrets.sh.j2). Requests are signed with
         Signature Version 4 (`sigv4_authorization`, AWS General Reference,
         "Signature Version 4 signing process"; tested against AWS's own
         aws-sig-v4-test-suite vectors).
  GCP    GET /computeMetadata/v1/instance/service-accounts/default/token with
         Metadata-Flavor: Google ({access_token, expires_in}) and
         /computeMetadata/v1/project/project-id (Compute Engine docs, "About VM
         metadata"; fetch-secrets.sh.j2 does the same).
  Azure  GET /metadata/identity/oauth2/token?api-version=2018-02-01&resource=
         https://management.azure.com/ with Metadata: true ({access_token,
         expires_in}), and /metadata/instance/compute?api-version=2021-02-01
         (subscriptionId, resourceGroupName) (learn.microsoft.com, "Azure
         Instance Metadata Service" and "How to use managed identities for Azure
         resources on an Azure VM to acquire an access token").

The calls, each named as its API reference names it:

  find_instance (read only)
    AWS    EC2 DescribeInstances (Query API, Version 2016-11-15) with the
           filters private-dns-name = the node's name and
           tag:aws:autoscaling:groupName = the group (EC2 API Reference,
           DescribeInstances "Filter.N"; Auto Scaling tags its instances
           aws:autoscaling:groupName); the answer's reservationSet/item/
           instancesSet/item: instanceId, instanceState/name, placement/
           availabilityZone, privateDnsName.
    GCP    compute.instanceGroupManagers.listManagedInstances (POST
           .../projects/P/zones/Z/instanceGroupManagers/MIG/listManagedInstances):
           managedInstances[].instance (the instance's URL) and .instanceStatus
           (Compute Engine API v1 reference; ManagedInstance).
    Azure  Virtual Machine Scale Set VMs - List (GET .../virtualMachineScaleSets/
           VMSS/virtualMachines?$expand=instanceView): value[].instanceId,
           .properties.osProfile.computerName (the node's name) and
           .properties.instanceView.statuses[].code `PowerState/running`
           (Azure REST API reference, Compute).
  replace_instance (what the operator path, corral.health.instances.replace_command, does)
    AWS    Auto Scaling TerminateInstanceInAutoScalingGroup (Version 2011-01-01),
           InstanceId, ShouldDecrementDesiredCapacity=false: the group launches
           a replacement (Amazon EC2 Auto Scaling API Reference).
    GCP    compute.instanceGroupManagers.recreateInstances, body {"instances":
           ["zones/Z/instances/NAME"]} (InstanceGroupManagersRecreateInstancesRequest).
    Azure  Virtual Machine Scale Sets - Delete Instances (POST .../VMSS/delete,
           body {"instanceIds": [N]}): as `az vmss delete-instances` in the
           operator path; cluster-autoscaler grows the set again for the pods.

Endpoints are the clouds' own; CloudSession takes others only as constructor
arguments (the tests' fake HTTPS cloud), never from the environment or the
cluster file, so nothing a pod or a cluster-file edit sets can send this
machine's credentials elsewhere. Credentials and tokens are never logged or
put in an error message.
"""

from __future__ import annotations

import calendar
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

if TYPE_CHECKING:   # pydantic is not in the pod: a NodeGroup is read by its attributes only
    from .instances import NodeGroup, Target

PROVIDERS = ("aws", "gcp", "azure")
# Every cloud's metadata service answers on this address (GCE's metadata.google.internal
# resolves to it; corral/machine/metadata_block.py): no DNS needed on the host network.
METADATA_URL = "http://169.254.169.254"
API_URLS = {
    "ec2": "https://ec2.{region}.amazonaws.com",
    "autoscaling": "https://autoscaling.{region}.amazonaws.com",
    "gcp": "https://compute.googleapis.com",
    "azure": "https://management.azure.com",
}
EC2_API_VERSION = "2016-11-15"
AUTOSCALING_API_VERSION = "2011-01-01"
AZURE_COMPUTE_API_VERSION = "2024-03-01"
AZURE_IMDS_TOKEN_API_VERSION = "2018-02-01"
AZURE_IMDS_INSTANCE_API_VERSION = "2021-02-01"
AZURE_MANAGEMENT_RESOURCE = "https://management.azure.com/"
IMDS_TOKEN_TTL_SECONDS = 300
# A credential is renewed this long before it expires.
CREDENTIAL_MARGIN_SECONDS = 120
TIMEOUT_SECONDS = 10

# What the identity running these calls must hold, per cloud (corral/infra/<cloud>/ grants
# exactly these to the API servers' identity; tests/infra/test_cloud_api_iam.py checks it).
# AWS: Service Authorization Reference, Amazon EC2 and Amazon EC2 Auto Scaling. GCP: the
# permission each method's reference names (listManagedInstances: compute.instanceGroupManagers.get;
# gcloud's list-instances names .list; recreateInstances: compute.instanceGroupManagers.update).
# Azure: "Azure permissions for Compute" (resource provider operations).
READ_PERMISSIONS = {
    "aws": ("ec2:DescribeInstances",),
    "gcp": ("compute.instanceGroupManagers.get", "compute.instanceGroupManagers.list"),
    "azure": ("Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",),
}
REPLACE_PERMISSIONS = {
    "aws": ("autoscaling:TerminateInstanceInAutoScalingGroup",),
    "gcp": ("compute.instanceGroupManagers.update",),
    "azure": ("Microsoft.Compute/virtualMachineScaleSets/delete/action",),
}


class CloudApiError(Exception):
    """The cloud's API or metadata service did not answer as documented (the message names
    the call and the HTTP status, never a credential)."""


@dataclass(frozen=True)
class Group:
    """A pool's group as the pod knows it: the attributes of corral.health.instances.NodeGroup
    (the stack output `nodeGroups`), without pydantic."""

    provider: str
    name: str
    region: str
    zones: tuple[str, ...]
    project: str = ""
    subscription: str = ""
    resource_group: str = ""


def pool_groups(groups: list[dict], identity: dict) -> list[Group]:
    """A pool's groups as this client takes them: names, region and zones from the cluster file (the
    add-on's config), project / subscription and resource group from the instance's own identity
    (CloudSession.identity): the approver and the repair controller both ask the cloud this way."""
    return [Group(g["provider"], g["name"], g["region"], tuple(g["zones"]), project=identity.get("project", ""),
                  subscription=identity.get("subscription", ""), resource_group=identity.get("resource_group", ""))
            for g in groups]


@dataclass(frozen=True)
class Instance:
    """What the cloud says of the instance a node name names."""

    provider: str
    group: str
    node_name: str
    instance_id: str     # AWS instance id, GCE instance name, Azure scale-set instance id
    zone: str            # "" when the cloud's answer has none (Azure regional sets)
    state: str           # the cloud's own word: running, RUNNING, PowerState/running, ...
    running: bool


# --- Signature Version 4: corral/machine/sigv4.py, shipped beside this file in the pods ----

# (Signed is imported for the tests, which check the canonical request and string to sign.)
try:
    from corral.machine.sigv4 import Signed, sigv4_authorization
except ImportError:   # run from a ConfigMap: sigv4.py is beside this file (api_server_host.py)
    from sigv4 import Signed, sigv4_authorization  # type: ignore[no-redef]  # noqa: F401


# --- the session: credentials from the metadata service, and HTTPS calls -----------------


class CloudSession:
    """One cloud's API, as this machine's identity. Tokens are fetched when first needed and
    renewed before they expire; `metadata_url`, `api_urls` and `context` replace the real
    ones in tests only."""

    def __init__(self, cloud: str, *, metadata_url: str = METADATA_URL, api_urls: dict[str, str] | None = None,
                 context: ssl.SSLContext | None = None, clock: Callable[[], float] = time.time,
                 timeout: float = TIMEOUT_SECONDS) -> None:
        if cloud not in PROVIDERS:
            raise CloudApiError(f"no cloud API for {cloud!r} (corral knows {', '.join(PROVIDERS)})")
        self.cloud = cloud
        self.metadata_url = metadata_url.rstrip("/")
        self.api_urls = {**API_URLS, **(api_urls or {})}
        self.context = context or ssl.create_default_context()
        self.clock = clock
        self.timeout = timeout
        self._credential: dict[str, Any] | None = None
        self._identity: dict[str, str] | None = None

    @classmethod
    def from_metadata(cls, cloud: str) -> CloudSession:
        """The session of the machine this runs on (its instance metadata service)."""
        return cls(cloud)

    # -- HTTP ---------------------------------------------------------------------------

    def _open(self, method: str, url: str, headers: dict[str, str], body: bytes | None, what: str) -> bytes:
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        https = url.startswith("https://")
        # Nothing is sent to a proxy: the environment's proxies are not this machine's identity's.
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if https:
            handlers.append(urllib.request.HTTPSHandler(context=self.context))
        opener = urllib.request.build_opener(*handlers)
        try:
            with opener.open(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            detail = err.read()[:300].decode("utf-8", "replace")
            raise CloudApiError(f"{what}: HTTP {err.code} {err.reason}: {_scrub(detail)}") from None
        except (urllib.error.URLError, OSError) as err:
            raise CloudApiError(f"{what}: {getattr(err, 'reason', err)}") from None

    def _metadata(self, method: str, path: str, headers: dict[str, str], what: str) -> bytes:
        return self._open(method, self.metadata_url + path, headers, b"" if method == "PUT" else None, what)

    # -- credentials ----------------------------------------------------------------------

    def _fresh(self) -> bool:
        return self._credential is not None and self._credential["expires"] - CREDENTIAL_MARGIN_SECONDS > self.clock()

    def _aws_metadata(self) -> dict[str, str]:
        token = self._metadata("PUT", "/latest/api/token",
                               {"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_SECONDS)},
                               "IMDSv2 token").decode().strip()
        return {"X-aws-ec2-metadata-token": token}

    def credential(self) -> dict[str, Any]:
        if self._fresh():
            return self._credential   # type: ignore[return-value]
        try:
            self._credential = self._fetch_credential()
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise CloudApiError(f"{self.cloud} metadata service: a credential in an unexpected shape "
                                f"({type(err).__name__})") from None
        return self._credential

    def _fetch_credential(self) -> dict[str, Any]:
        if self.cloud == "aws":
            headers = self._aws_metadata()
            role = self._metadata("GET", "/latest/meta-data/iam/security-credentials/", headers,
                                  "IMDS role name").decode().split()[0]
            data = _json(self._metadata("GET", f"/latest/meta-data/iam/security-credentials/{role}", headers,
                                        "IMDS role credentials"), "IMDS role credentials")
            return {"access_key": data["AccessKeyId"], "secret_key": data["SecretAccessKey"],
                    "token": data.get("Token", ""), "expires": _rfc3339(data.get("Expiration", ""))}
        if self.cloud == "gcp":
            data = _json(self._metadata("GET", "/computeMetadata/v1/instance/service-accounts/default/token",
                                        {"Metadata-Flavor": "Google"}, "GCE metadata token"), "GCE metadata token")
        else:
            query = urllib.parse.urlencode({"api-version": AZURE_IMDS_TOKEN_API_VERSION,
                                            "resource": AZURE_MANAGEMENT_RESOURCE})
            data = _json(self._metadata("GET", f"/metadata/identity/oauth2/token?{query}", {"Metadata": "true"},
                                        "Azure IMDS token"), "Azure IMDS token")
        return {"token": data["access_token"], "expires": self.clock() + float(data["expires_in"])}

    def identity(self) -> dict[str, str]:
        """Where this machine is: GCP {project}, Azure {subscription, resource_group}, AWS {}."""
        if self._identity is None:
            if self.cloud == "gcp":
                project = self._metadata("GET", "/computeMetadata/v1/project/project-id",
                                         {"Metadata-Flavor": "Google"}, "GCE project id").decode().strip()
                self._identity = {"project": project}
            elif self.cloud == "azure":
                query = urllib.parse.urlencode({"api-version": AZURE_IMDS_INSTANCE_API_VERSION})
                data = _json(self._metadata("GET", f"/metadata/instance/compute?{query}", {"Metadata": "true"},
                                            "Azure IMDS compute"), "Azure IMDS compute")
                if not isinstance(data, dict) or not data.get("subscriptionId") or not data.get("resourceGroupName"):
                    raise CloudApiError("Azure IMDS compute: no subscriptionId and resourceGroupName")
                self._identity = {"subscription": str(data["subscriptionId"]),
                                  "resource_group": str(data["resourceGroupName"])}
            else:
                self._identity = {}
        return self._identity

    # -- API calls ------------------------------------------------------------------------

    def aws_query(self, service: str, region: str, params: dict[str, str], what: str) -> ElementTree.Element:
        """A signed POST of the Query API (form-encoded Action=...&Version=...) to `service`."""
        credential = self.credential()
        url = self.api_urls[service].format(region=region) + "/"
        parts = urllib.parse.urlsplit(url)
        body = urllib.parse.urlencode(params).encode()
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8", "Host": parts.netloc,
                   "X-Amz-Date": amz_date}
        if credential["token"]:
            headers["X-Amz-Security-Token"] = credential["token"]
        signed = sigv4_authorization("POST", parts.path, parts.query, headers.items(), body,
                                     access_key=credential["access_key"], secret_key=credential["secret_key"],
                                     region=region, service=service, amz_date=amz_date)
        headers["Authorization"] = signed.authorization
        answer = self._open("POST", url, headers, body, what)
        try:
            return ElementTree.fromstring(answer)
        except ElementTree.ParseError:
            raise CloudApiError(f"{what}: the answer is not XML") from None

    def bearer(self, method: str, url: str, body: Any, what: str) -> Any:
        """A JSON call with this machine's OAuth token (GCP, Azure)."""
        headers = {"Authorization": f"Bearer {self.credential()['token']}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        answer = self._open(method, url, headers, data, what)
        return _json(answer, what) if answer.strip() else {}


def _json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise CloudApiError(f"{what}: the answer is not JSON") from None


def _rfc3339(text: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return 0.0   # unknown expiry: fetched again next time


def _scrub(text: str) -> str:
    """An error body as it may be logged: one line, no bearer or signature in it."""
    line = " ".join(text.split())
    for marker in ("Bearer ", "Signature=", "X-Amz-Security-Token"):
        if marker in line:
            line = line.split(marker, 1)[0] + marker + "(redacted)"
    return line


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(element: ElementTree.Element, *path: str) -> ElementTree.Element | None:
    for name in path:
        element = next((c for c in element if _local(c.tag) == name), None)   # type: ignore[assignment]
        if element is None:
            return None
    return element


def _text(element: ElementTree.Element, *path: str) -> str:
    found = _child(element, *path)
    return (found.text or "").strip() if found is not None else ""


def _items(element: ElementTree.Element | None) -> list[ElementTree.Element]:
    return [c for c in element if _local(c.tag) == "item"] if element is not None else []


# --- find_instance -------------------------------------------------------------------------


def aws_private_dns_name(node_name: str, region: str) -> str:
    """The EC2 private DNS name a node name stands for: the name itself when it has a domain,
    else with the region's (ec2.internal in us-east-1, <region>.compute.internal elsewhere:
    EC2 User Guide, "EC2 instance hostname types")."""
    if "." in node_name:
        return node_name
    return f"{node_name}.ec2.internal" if region == "us-east-1" else f"{node_name}.{region}.compute.internal"


def _aws_find(group: NodeGroup | Group, node_name: str, session: CloudSession) -> Instance | None:
    dns_name = aws_private_dns_name(node_name, group.region)
    root = session.aws_query("ec2", group.region, {
        "Action": "DescribeInstances", "Version": EC2_API_VERSION,
        "Filter.1.Name": "private-dns-name", "Filter.1.Value.1": dns_name,
        "Filter.2.Name": "tag:aws:autoscaling:groupName", "Filter.2.Value.1": group.name,
    }, f"ec2 DescribeInstances {dns_name} in {group.name}")
    found = []
    for reservation in _items(_child(root, "reservationSet")):
        for item in _items(_child(reservation, "instancesSet")):
            if _text(item, "privateDnsName") != dns_name:
                continue   # the filter's job, checked again: only an exact answer counts
            state, zone = _text(item, "instanceState", "name"), _text(item, "placement", "availabilityZone")
            found.append(Instance("aws", group.name, node_name, _text(item, "instanceId"), zone, state,
                                  state == "running" and zone in group.zones))
    return _pick(found)


def _gcp_find(group: NodeGroup | Group, node_name: str, session: CloudSession) -> Instance | None:
    found = []
    for zone in group.zones:
        url = (f"{session.api_urls['gcp']}/compute/v1/projects/{_seg(group.project)}/zones/{_seg(zone)}/"
               f"instanceGroupManagers/{_seg(group.name)}/listManagedInstances")
        answer = session.bearer("POST", url, None, f"listManagedInstances {group.name} ({zone})")
        tail = f"projects/{group.project}/zones/{zone}/instances/{node_name}"
        for managed in answer.get("managedInstances") or []:
            address = str(managed.get("instance", ""))
            if address == tail or address.endswith("/" + tail):
                status = str(managed.get("instanceStatus", ""))
                found.append(Instance("gcp", group.name, node_name, node_name, zone, status, status == "RUNNING"))
    return _pick(found)


def _azure_set_path(group: NodeGroup | Group) -> str:
    return (f"/subscriptions/{_seg(group.subscription)}/resourceGroups/{_seg(group.resource_group)}/providers/"
            f"Microsoft.Compute/virtualMachineScaleSets/{_seg(group.name)}")


def _azure_find(group: NodeGroup | Group, node_name: str, session: CloudSession) -> Instance | None:
    base = session.api_urls["azure"]
    query = urllib.parse.urlencode({"api-version": AZURE_COMPUTE_API_VERSION, "$expand": "instanceView"})
    url: str | None = f"{base}{_azure_set_path(group)}/virtualMachines?{query}"
    found, pages = [], 0
    while url and pages < 100:
        answer = session.bearer("GET", url, None, f"VMSS VMs list {group.name}")
        pages += 1
        for vm in answer.get("value") or []:
            properties = vm.get("properties") or {}
            if str((properties.get("osProfile") or {}).get("computerName", "")).lower() != node_name.lower():
                continue
            codes = [str(s.get("code", "")) for s in (properties.get("instanceView") or {}).get("statuses") or []]
            power = next((c for c in codes if c.startswith("PowerState/")), "PowerState/unknown")
            zones = vm.get("zones") or []
            found.append(Instance("azure", group.name, node_name, str(vm.get("instanceId", "")),
                                  str(zones[0]) if zones else "", power, power == "PowerState/running"))
        url = answer.get("nextLink")
        # The next page only from the same API host: the token goes nowhere else.
        if url and not url.startswith(base + "/"):
            raise CloudApiError(f"VMSS VMs list {group.name}: nextLink leaves {base}")
    return _pick(found)


def _seg(text: str) -> str:
    return urllib.parse.quote(str(text), safe="")


def _pick(found: list[Instance]) -> Instance | None:
    """The running instance of that name if there is one (a name is unique among running ones)."""
    running = [i for i in found if i.running]
    return (running or found or [None])[0]


_FIND = {"aws": _aws_find, "gcp": _gcp_find, "azure": _azure_find}


def find_instance(group: NodeGroup | Group, node_name: str, *, session: CloudSession) -> Instance | None:
    """The instance of `group` whose node name is `node_name`, as the cloud says now (None: the
    group has no such instance). Read-only. CloudApiError when the cloud cannot be asked."""
    if group.provider != session.cloud:
        raise CloudApiError(f"group {group.name} is on {group.provider}, this session on {session.cloud}")
    try:
        return _FIND[group.provider](group, node_name, session)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        # An answer not shaped as the API reference says (or a metadata service that is not one).
        raise CloudApiError(f"{group.provider} answered {group.name}'s lookup of {node_name} in an unexpected "
                            f"shape ({type(err).__name__})") from None


# --- replace_instance ---------------------------------------------------------------------


def replace_instance(target: Target, *, session: CloudSession) -> None:
    """Take the target's instance away so its group replaces it, with the stack's values
    (target.group: region, project, subscription, resource group, group name) and the
    instance the caller verified (corral.health.instances.verify / match)."""
    group, claim = target.group, target.claim
    if group.provider != session.cloud:
        raise CloudApiError(f"group {group.name} is on {group.provider}, this session on {session.cloud}")
    try:
        _replace(group, claim, session)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CloudApiError(f"{group.provider} answered the replacement of {claim.instance} in an unexpected "
                            f"shape ({type(err).__name__})") from None


def _replace(group: NodeGroup | Group, claim: Any, session: CloudSession) -> None:
    if group.provider == "aws":
        session.aws_query("autoscaling", group.region, {
            "Action": "TerminateInstanceInAutoScalingGroup", "Version": AUTOSCALING_API_VERSION,
            "InstanceId": claim.instance, "ShouldDecrementDesiredCapacity": "false",
        }, f"autoscaling TerminateInstanceInAutoScalingGroup {claim.instance}")
    elif group.provider == "gcp":
        url = (f"{session.api_urls['gcp']}/compute/v1/projects/{_seg(group.project)}/zones/{_seg(claim.zone)}/"
               f"instanceGroupManagers/{_seg(group.name)}/recreateInstances")
        session.bearer("POST", url, {"instances": [f"zones/{claim.zone}/instances/{claim.instance}"]},
                       f"recreateInstances {claim.instance} in {group.name}")
    else:
        query = urllib.parse.urlencode({"api-version": AZURE_COMPUTE_API_VERSION})
        url = f"{session.api_urls['azure']}{_azure_set_path(group)}/delete?{query}"
        session.bearer("POST", url, {"instanceIds": [claim.instance]},
                       f"VMSS delete instances {claim.instance} of {group.name}")
