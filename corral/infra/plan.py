"""`corral plan`: the Pulumi program, run offline under Pulumi's mocks.

The program is `program.main`, the same function `pulumi up` runs; only the
engine is replaced. No cloud account, no pulumi CLI, no provider plugin.

What is recorded, per registered resource (custom and component alike):
    type              the type token (`azure-native:compute:Disk`, `corral:azure:Etcd`)
    name              the logical name
    parent            the parent's logical name (null: a child of the stack)
    component         the top-level component it belongs to (the table's groups)
    protect           the `protect` option the engine would get
    retainOnDelete    the `retain_on_delete` option
    ignoreChanges     the `ignore_changes` option (only where set): inputs
                      `pulumi up` leaves alone on an existing resource
    deleteBeforeReplace  the `delete_before_replace` option (only where set)
    inputs            the inputs as the provider would get them, secrets
                      masked as "[secret]", values only known after a real
                      apply as "[unknown]"

`MockResourceArgs` carries neither the parent nor the options, so the plan
uses its own monitor: `RecordingMonitor` subclasses Pulumi's `MockMonitor`
and reads `parent`, `protect`, `retainOnDelete`, `ignoreChanges` and
`deleteBeforeReplace` off each
RegisterResource request (the wire message the real engine gets), then lets
the mock monitor answer as usual.

Runs are deterministic: mock ids are `<name>-id`, computed outputs are
left unknown (a preview, as `pulumi preview` shows them), and resources are
sorted by component, type and name. Values derived from unknowns (the
machines' user data) are unknown too; the program renders every kind of
user data once with placeholders up front (`bootstrap.check_renders`), so
template errors still fail the plan. Stack settings come from
stacks/Pulumi.<cluster>.yaml, as `pulumi up` would read them.

Secret masking, in layers: anything Pulumi marks secret (pulumi-tls private
keys, `Output.secret`, additional secret outputs) is masked where it appears;
any string holding a PEM private key is masked whatever its marking; and any
string containing a secret's plaintext seen elsewhere in the run is masked.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pulumi
from pulumi.output import Unknown
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc, settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await
from google.protobuf import struct_pb2

from corral.model import Cluster
from corral.model.fleet import LoadedFleet

from . import program

PROJECT = "corral"
SECRET = "[secret]"
UNKNOWN = "[unknown]"
STACK_TYPE = "pulumi:pulumi:Stack"
# Shorter strings are not treated as leaked secrets (too many false alarms).
MIN_SECRET_LENGTH = 8
PRIVATE_KEY_MARKERS = ("PRIVATE KEY-----", "PRIVATE KEY BLOCK")


class PlanError(Exception):
    """A plan that could not be made; the message says why."""


# --- The mocked engine --------------------------------------------------------


class PlanMocks(pulumi_mocks.Mocks):
    """Deterministic stand-ins for the providers.

    A resource's outputs are its inputs, plus a `name` (the logical name)
    when the inputs have none, as cloud resources report their names. All
    other computed outputs stay unknown, as in `pulumi preview`.
    """

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str, dict]:
        state = dict(args.inputs)
        state.setdefault("name", args.name)
        identity = state.get("identity")
        if isinstance(identity, dict) and isinstance(identity.get("userAssignedIdentities"), list):
            # Azure takes user-assigned identities as a list of ids and reports
            # a map keyed by id: the SDK cannot read the list back as outputs.
            state["identity"] = {**identity, "userAssignedIdentities": {i: {} for i in identity["userAssignedIdentities"]}}
        return f"{args.name}-id", state

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict, list | None]:
        return {}, []


@dataclass
class Registration:
    type: str
    name: str
    urn: str
    parent_urn: str
    protect: bool
    retain_on_delete: bool
    custom: bool
    inputs: Any
    ignore_changes: list[str] = field(default_factory=list)
    delete_before_replace: bool = False


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """Pulumi's mock monitor, also keeping each RegisterResource request's parent and options."""

    def __init__(self, mocks: pulumi_mocks.Mocks):
        super().__init__(mocks)
        self.registrations: list[Registration] = []
        self._lock = threading.Lock()

    def RegisterResource(self, request):  # noqa: N802  (the gRPC method's name)
        response = super().RegisterResource(request)
        if request.type == STACK_TYPE:
            return response
        inputs = decode_wire(request.object)
        registration = Registration(
            type=request.type,
            name=request.name,
            urn=response.urn,
            parent_urn=request.parent,
            protect=bool(request.protect) if request.HasField("protect") else False,
            retain_on_delete=bool(request.retainOnDelete) if request.HasField("retainOnDelete") else False,
            custom=bool(request.custom),
            inputs=inputs,
            ignore_changes=list(request.ignoreChanges),
            delete_before_replace=bool(request.deleteBeforeReplace),
        )
        # The SDK registers resources from a thread pool.
        with self._lock:
            self.registrations.append(registration)
        return response


class _Diagnostics(logging.Handler):
    """Collects the program's pulumi.log warnings and errors (the mock engine logs them here)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = f"{record.levelname.lower()}: {record.getMessage()}"
        if message not in self.messages:
            self.messages.append(message)


# --- Masking --------------------------------------------------------------------


@dataclass(frozen=True)
class SecretValue:
    """A value the engine would get marked secret, at exactly the place it was marked."""

    value: Any


def decode_wire(value: Any) -> Any:
    """A RegisterResource property (protobuf Struct/ListValue/scalar) as plain Python.

    Pulumi's own `rpc.deserialize_properties` pushes a secret up to the dict or
    list holding it, which would hide (and, when remembered, mask) harmless
    siblings such as a VM's name beside its user data; this keeps each secret
    where it is: `SecretValue`. Unknowns become `Unknown`.
    """
    if isinstance(value, struct_pb2.Struct):
        if rpc._special_sig_key in value:
            signature = value[rpc._special_sig_key]
            if signature == rpc._special_secret_sig:
                return SecretValue(decode_wire(value["value"]) if "value" in value else None)
            if signature == rpc._special_resource_sig:
                return f"resource:{value['urn']}" if "urn" in value else "resource"
            return f"<{signature}>"  # assets, archives
        return {key: decode_wire(item) for key, item in value.items()}
    if isinstance(value, struct_pb2.ListValue):
        return [decode_wire(item) for item in value]
    if value == rpc.UNKNOWN:
        return Unknown()
    return value


class Masker:
    """Turns recorded values into JSON, masking secrets (see the module docstring)."""

    def __init__(self):
        self.secrets: set[str] = set()

    def remember(self, value: Any) -> None:
        """Note a secret's plaintext (its string leaves), to find it wherever it leaks."""
        if isinstance(value, SecretValue):
            self.remember(value.value)
        elif isinstance(value, str):
            if len(value) >= MIN_SECRET_LENGTH:
                self.secrets.add(value)
        elif isinstance(value, dict):
            for item in value.values():
                self.remember(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                self.remember(item)

    def plain(self, value: Any) -> Any:
        """First pass: secrets and unknowns marked, numbers tidied, plaintexts remembered."""
        if isinstance(value, SecretValue):
            self.remember(value.value)
            return SECRET
        if isinstance(value, Unknown):
            return UNKNOWN
        if isinstance(value, dict):
            return {str(key): self.plain(item) for key, item in sorted(value.items())}
        if isinstance(value, (list, tuple)):
            return [self.plain(item) for item in value]
        if isinstance(value, float) and value.is_integer():
            return int(value)  # protobuf carries every number as a double
        if isinstance(value, str):
            return SECRET if any(marker in value for marker in PRIVATE_KEY_MARKERS) else value
        if value is None or isinstance(value, (bool, int, float)):
            return value
        return repr(value)

    def scrub(self, value: Any) -> Any:
        """Second pass: any string containing a remembered secret is masked."""
        if isinstance(value, str):
            if value not in (SECRET, UNKNOWN) and any(secret in value for secret in self.secrets):
                return SECRET
            return value
        if isinstance(value, dict):
            return {key: self.scrub(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.scrub(item) for item in value]
        return value


async def _resolve_output(value: Any, masker: Masker) -> Any:
    """A stack output's value, masked: nested dicts are resolved entry by entry."""
    if isinstance(value, dict):
        return {str(key): await _resolve_output(item, masker) for key, item in sorted(value.items())}
    output = pulumi.Output.from_input(value)
    data = await output.future(with_unknowns=True)
    if await output.is_secret():
        masker.remember(data)
        return SECRET
    if not await output.is_known():
        return UNKNOWN
    return masker.plain(data)


# --- The plan ---------------------------------------------------------------------


@dataclass
class Plan:
    cluster: str
    cloud: str
    resources: list[dict[str, Any]]
    outputs: dict[str, Any]
    diagnostics: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        """`corral plan --format json`: the resources, one object each."""
        return json.dumps(self.resources, indent=2, sort_keys=True) + "\n"

    def snapshot(self) -> dict[str, Any]:
        """The golden-file form: resources, outputs and diagnostics."""
        return {
            "cluster": self.cluster,
            "cloud": self.cloud,
            "resources": self.resources,
            "outputs": self.outputs,
            "diagnostics": self.diagnostics,
        }

    def components(self) -> dict[str, list[dict[str, Any]]]:
        """Resources grouped under their top-level component (its own name first)."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for resource in self.resources:
            groups.setdefault(resource["component"] or "(stack)", []).append(resource)
        return groups


def stack_config_file(cluster_name: str, clusters: Path | None = None) -> Path | None:
    """stacks/Pulumi.<cluster>.yaml beside the clusters folder, else in the project."""
    candidates = []
    if clusters is not None:
        candidates.append(Path(clusters).resolve().parent / "stacks")
    candidates.append(program.project_root() / "stacks")
    for folder in candidates:
        path = folder / f"Pulumi.{cluster_name}.yaml"
        if path.is_file():
            return path
    return None


def read_stack_config(path: Path | None) -> tuple[dict[str, str], list[str]]:
    """A stack file's `config:` as Pulumi hands it to a program: strings, JSON for the rest.

    `secure:` values cannot be decrypted offline; the program sees "[secret]".
    """
    if path is None:
        return {}, []
    from corral.model.document import Document, ValidationFailed

    try:
        # the cluster files' reader: the same size and depth limits, syntax errors with their line
        data = Document.read(path).load() or {}
    except ValidationFailed as failed:
        raise PlanError("cannot read stack settings: " + "; ".join(str(p) for p in failed.problems)) from None
    config = (data.get("config") or {}) if isinstance(data, dict) else {}
    values: dict[str, str] = {}
    secret_keys: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            values[key] = SECRET
            secret_keys.append(key)
        else:
            values[key] = value if isinstance(value, str) else json.dumps(value)
    return values, secret_keys


def _group_and_parent(registrations: list[Registration]) -> dict[str, tuple[str | None, str | None]]:
    """urn -> (parent name, top-level component name)."""
    by_urn = {r.urn: r for r in registrations}
    result: dict[str, tuple[str | None, str | None]] = {}
    for r in registrations:
        parent = by_urn.get(r.parent_urn)
        top = r
        while top.parent_urn in by_urn:
            top = by_urn[top.parent_urn]
        component = top.name if not top.custom else None
        result[r.urn] = (parent.name if parent else None, component)
    return result


@contextlib.contextmanager
def paused_gc():
    """No cyclic garbage collection while a plan runs.

    Pulumi's Outputs and futures form many short reference cycles, and each
    full collection rescans the tens of thousands of classes the cloud SDKs
    define: collecting halves the plan's CPU time for no memory a plan needs
    back. The previous state is restored afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def plan_cluster(
    cluster: Cluster,
    *,
    platform: ModuleType | None = None,
    mocks: pulumi_mocks.Mocks | None = None,
    stack_config: dict[str, str] | None = None,
    secret_config_keys: list[str] | None = None,
    preview: bool = True,
    fleet: LoadedFleet | None = None,
) -> Plan:
    """Run the program for `cluster` (and its `fleet` file) under mocks; what it would register, masked."""
    monitor = RecordingMonitor(mocks or PlanMocks())
    diagnostics = _Diagnostics()
    logger = logging.getLogger("corral.plan.engine")
    logger.propagate = False
    logger.handlers = [diagnostics]
    logger.setLevel(logging.WARNING)

    # A fresh runtime per plan: no stack or config left from an earlier one.
    settings.ROOT.set(None)
    pulumi.runtime.set_all_config(dict(stack_config or {}), list(secret_config_keys or []))
    pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT, stack=cluster.name, preview=preview, logger=logger, monitor=monitor)

    masker = Masker()

    def run_program() -> None:
        program.main(cluster=cluster, platform=platform, fleet=fleet)

    try:
        with paused_gc():
            _sync_await(run_pulumi_func(run_program))
            root = settings.get_root_resource()
            raw_outputs = dict(getattr(root, "outputs", {}) or {})
            outputs = _sync_await(_resolve_output(raw_outputs, masker))
    except program.ProgramError as err:
        raise PlanError(str(err)) from None
    finally:
        settings.ROOT.set(None)

    names = _group_and_parent(monitor.registrations)
    resources = []
    for r in monitor.registrations:
        parent, component = names[r.urn]
        resource = {
            "type": r.type,
            "name": r.name,
            "parent": parent,
            "component": component,
            "protect": r.protect,
            "retainOnDelete": r.retain_on_delete,
        }
        # Only where set, so a plan lists them where they matter.
        if r.ignore_changes:
            resource["ignoreChanges"] = sorted(r.ignore_changes)
        if r.delete_before_replace:
            resource["deleteBeforeReplace"] = True
        resource["inputs"] = masker.plain(r.inputs)
        resources.append(resource)
    resources = masker.scrub(resources)
    outputs = masker.scrub(outputs)
    resources.sort(key=lambda res: (
        res["component"] or "", res["name"] != res["component"], res["type"], res["name"],
    ))
    return Plan(cluster.name, cluster.control_plane.cloud, resources, outputs, diagnostics.messages)


def plan_stack(cluster: Cluster, clusters: Path | None = None, **kwargs: Any) -> Plan:
    """`plan_cluster` with the stack's settings from stacks/Pulumi.<cluster>.yaml and, when
    `clusters` is given, the fleet file beside it, as `pulumi up` loads them."""
    path = stack_config_file(cluster.name, clusters)
    config, secret_keys = read_stack_config(path)
    if path is not None:
        from corral.model.stack import placeholder_problems

        if problems := placeholder_problems(path, cluster.name):
            raise PlanError("; ".join(str(problem) for problem in problems))
    try:
        fleet = program.load_stack_fleet(clusters) if clusters is not None else None
    except program.ProgramError as err:
        raise PlanError(str(err)) from None
    return plan_cluster(cluster, stack_config=config, secret_config_keys=secret_keys, fleet=fleet, **kwargs)
