"""The fleet file (`fleet.yaml`): which clusters dispatch jobs to which, with MultiKueue.

A cluster file says what one cluster is; the fleet file says how clusters
work together. Today that is one thing (issue 29, item 3): a MultiKueue
manager cluster, its worker clusters, and the teams whose jobs are submitted
once on the manager and run on whichever worker admits them first
(docs/scheduling.md, "One queue for the fleet: MultiKueue").

The file is read like a cluster file: the same size and depth limits, every
problem at once with its file, line and field (`Document`), and the rules
across files name the cluster file and line a problem points at:

    fleet.yaml:7:5: multiKueue.workers[1]: no cluster 'kestrl' in clusters (clusters: heron, ibis, jaguar)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from . import loader
from .document import Document, PathElem, Problem, ValidationFailed
from .loader import Fleet, load_fleet
from .schema import Cluster, Description, Name, Spec, Team, shown

FLEET_FILE = "fleet.yaml"
FLEET_KIND = "Fleet"

# MultiKueueConfig.spec.clusters holds 1-20 names (minItems 1, maxItems 20 in the pinned
# CRD, tests/manifests/kueue_crds/v0.19.2/kueue.x-k8s.io_multikueueconfigs.yaml; 10 at v0.12.10).
MAX_WORKERS = 20

# Go's time.ParseDuration units, as metav1.Duration reads `workerLostTimeout`
# (kueue apis/config/v1beta2/configuration_types.go, MultiKueue.WorkerLostTimeout, v0.19.2).
_GO_DURATION = re.compile(r"([0-9]+(\.[0-9]+)?(h|m|s|ms))+\Z")


def _check_duration(value: str) -> str:
    if len(value) > 20 or not _GO_DURATION.match(value):
        raise ValueError(f"{shown(value)} must be a duration like 15m, 1h or 1h30m")
    return value


Duration = Annotated[str, AfterValidator(_check_duration),
                     WithJsonSchema({"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(h|m|s|ms))+$"})]

# The job kinds MultiKueue may dispatch, as the manager's identity on a worker
# needs them: each kind adds only its own RBAC rules on the worker
# (corral/manifests/multikueue.py, JOB_KIND_RULES), so a fleet that dispatches
# batch Jobs gives the manager no right over JobSets or pods.
JOB_KINDS: tuple[str, ...] = ("batch/job", "jobset.x-k8s.io/jobset")
JobKind = Literal["batch/job", "jobset.x-k8s.io/jobset"]


class MultiKueue(Spec):
    """One MultiKueue manager and its workers (docs/scheduling.md, "One queue for the fleet")."""

    manager: Name = Field(
        description="The cluster (clusters/<name>.yaml) where jobs are submitted; it runs the MultiKueue "
        "admission check and runs none of the dispatched jobs itself.",
    )
    workers: list[Name] = Field(
        min_length=1, max_length=MAX_WORKERS,
        description="The clusters jobs are dispatched to (the MultiKueueConfig's clusters, in this order); "
        f"1-{MAX_WORKERS}, never the manager.",
    )
    teams: list[Name] = Field(
        min_length=1,
        description="Teams (scheduling.teams) whose queues are dispatched: each must be a team of the manager and "
        "of every worker, with the same namespaces and GPU quota on every worker.",
    )
    job_kinds: list[JobKind] = Field(
        ["batch/job"],
        description="Kinds of job the manager may create on the workers (its RBAC there): batch/job, "
        "jobset.x-k8s.io/jobset. Default [batch/job].",
    )
    worker_lost_timeout: Duration | None = Field(
        None,
        description="How long a job stays admitted while the worker running it is unreachable, before it is "
        "requeued to another worker; unset: Kueue's default, 15m.",
    )

    @field_validator("workers", "teams", "job_kinds")
    @classmethod
    def _no_repeats(cls, values: list[str]) -> list[str]:
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"{', '.join(shown(v) for v in repeated)} listed more than once")
        return values


class FleetFile(Spec):
    """The fleet file: fleet.yaml beside the clusters folder."""

    api_version: Literal["corral.dev/v1"] = Field(alias="apiVersion", description="Always corral.dev/v1.")
    kind: Literal["Fleet"] = Field(description="Always Fleet.")
    name: Name = Field(description="The fleet's name: the origin label of the objects MultiKueue creates on workers.")
    description: Description = Field("", description="One line for people; default empty.")
    multi_kueue: MultiKueue = Field(description="Jobs submitted once on a manager cluster, run on its workers.")


@dataclass
class LoadedFleet:
    """A fleet file with the clusters it names, all validated together."""

    spec: FleetFile
    document: Document
    clusters: Fleet

    @property
    def manager(self) -> Cluster:
        return self.clusters.clusters[self.spec.multi_kueue.manager]

    @property
    def workers(self) -> list[Cluster]:
        return [self.clusters.clusters[name] for name in self.spec.multi_kueue.workers]


# --- Reading -----------------------------------------------------------------


def _allowed_keys(path: tuple) -> list[str]:
    model: type[Spec] | None = FleetFile
    for elem in path:
        info = next((f for n, f in model.model_fields.items() if elem in (n, f.alias)), None) if model else None
        model = info.annotation if info is not None and isinstance(info.annotation, type) else None
    if model is None or not issubclass(model, Spec):
        return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _problems(doc: Document, error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        if item["type"] == "extra_forbidden":
            known = _allowed_keys(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(known)})"
            message = f"unknown key {shown(str(loc[-1]))}{hint}"
        else:
            # The cluster files' wording for everything else (missing, types, values).
            message = loader._message(item)
        problems.append(doc.problem(loc, message))
    return problems


def parse_fleet_document(doc: Document) -> FleetFile:
    data = doc.load()
    if not isinstance(data, dict):
        raise ValidationFailed([Problem(doc.display, 1, 1, (), "a fleet file must be a YAML mapping")])
    if data.get("kind") == "Cluster":
        raise ValidationFailed([doc.problem(("kind",), "this is a cluster file; a fleet file has kind: Fleet")])
    try:
        return FleetFile.model_validate(data)
    except ValidationError as err:
        raise ValidationFailed(_problems(doc, err)) from None


def load_fleet_file(path: Path | str, clusters: Path | str) -> LoadedFleet:
    """The fleet file at `path` and the cluster files of `clusters`, with the rules across them.

    Cluster-file problems are reported as `corral validate` reports them; the
    fleet file's own problems (shape first, then the rules across files) all
    at once, each at its line.
    """
    path = Path(path)
    if not path.exists():
        raise ValidationFailed([Problem(str(path), 1, 1, (), "no such file (a fleet file: docs/scheduling.md)")])
    doc = Document.read(path)
    spec = parse_fleet_document(doc)
    fleet = load_fleet([clusters])
    found = [doc.problem(where, message) for where, message in check_fleet_file(spec, fleet, Path(clusters))]
    if found:
        raise ValidationFailed(found)
    return LoadedFleet(spec, doc, fleet)


# --- Rules across the fleet file and the cluster files ---------------------------


def _place(fleet: Fleet, cluster: str, where: tuple[PathElem, ...]) -> str:
    doc = fleet.documents[cluster]
    line, _ = doc.position(where)
    return f"{doc.display}:{line}"


def team_of(cluster: Cluster, name: str) -> tuple[int, Team] | None:
    for index, team in enumerate(cluster.scheduling.teams):
        if team.name == name:
            return index, team
    return None


def kueue_enabled(cluster: Cluster) -> bool:
    """Kueue runs on the cluster (`scheduling.kueue.enabled`, corral/model/kueue.py)."""
    return cluster.scheduling.kueue.enabled


def team_gpu_models(cluster: Cluster, team: Team) -> dict[str, int]:
    """GPU model -> GPUs of the team's reserved pools at their maximum size: its quota on this cluster."""
    models: dict[str, int] = {}
    for pool in cluster.node_pools:
        if pool.name in team.reserved_pools and pool.gpu is not None:
            models[pool.gpu.model] = models.get(pool.gpu.model, 0) + pool.gpu.count * pool.capacity
    return models


def check_fleet_file(spec: FleetFile, fleet: Fleet, clusters_dir: Path) -> Iterator[tuple[tuple, str]]:
    """(fleet-file path, message) for every rule the fleet file breaks against the cluster files."""
    mk = spec.multi_kueue
    known = ", ".join(sorted(fleet.clusters))

    def missing(name: str) -> str:
        close = difflib.get_close_matches(name, list(fleet.clusters), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"no cluster {shown(name)} in {clusters_dir} ({hint}clusters: {known})"

    roles: list[tuple[tuple, str]] = []
    if mk.manager not in fleet.clusters:
        yield ("multiKueue", "manager"), missing(mk.manager)
    else:
        roles.append((("multiKueue", "manager"), mk.manager))
    for index, worker in enumerate(mk.workers):
        where = ("multiKueue", "workers", index)
        if worker == mk.manager:
            # Kueue: "We do not currently support running the manager cluster
            # as one of the workers for itself" (site/content/en/docs/concepts/
            # multikueue.md, Limitations, written down in v0.17 and still there
            # at the pinned v0.19.2: the remote Workload would be the local one, same
            # namespace and name on the same API server).
            yield where, (f"{shown(worker)} is the manager: Kueue does not support a manager that is a worker "
                          "of itself (Kueue docs, MultiKueue, Limitations); jobs meant to run on the manager "
                          "go to a team that is not dispatched")
        elif worker not in fleet.clusters:
            yield where, missing(worker)
        else:
            roles.append((where, worker))

    for where, name in roles:
        if not kueue_enabled(fleet.clusters[name]):
            yield where, (f"cluster {name} does not run Kueue: set scheduling.kueue.enabled: true in "
                          f"{_place(fleet, name, ('scheduling',))}; MultiKueue needs Kueue on the manager and "
                          "every worker")

    manager = fleet.clusters.get(mk.manager)
    workers = [name for where, name in roles if name != mk.manager]
    for index, team_name in enumerate(mk.teams):
        where = ("multiKueue", "teams", index)
        on_manager = team_of(manager, team_name) if manager is not None else None
        if manager is not None and on_manager is None:
            yield where, (f"team {shown(team_name)} is not a team of the manager {mk.manager} "
                          f"({_place(fleet, mk.manager, ('scheduling',))}): its namespaces and queues are "
                          "where the team submits")
        for worker in workers:
            cluster = fleet.clusters[worker]
            on_worker = team_of(cluster, team_name)
            if on_worker is None:
                yield where, (f"team {shown(team_name)} is not a team of worker {worker} "
                              f"({_place(fleet, worker, ('scheduling',))}): MultiKueue creates the team's jobs in "
                              "the same namespace and queue on the worker, which must exist there")
                continue
            worker_index, worker_team = on_worker
            team_place = _place(fleet, worker, ("scheduling", "teams", worker_index))
            if on_manager is not None:
                absent = [ns for ns in on_manager[1].namespaces if ns not in worker_team.namespaces]
                if absent:
                    yield where, (f"team {team_name} on worker {worker} ({team_place}) lacks namespace"
                                  f"{'s' * (len(absent) > 1)} {', '.join(absent)} of the manager's team: a job "
                                  "submitted there could never be created on this worker")
            if not team_gpu_models(cluster, worker_team):
                yield where, (f"team {team_name} has no GPU quota on worker {worker} ({team_place}: no reservedPools "
                              "with GPUs): its ClusterQueue there would admit no GPU job")
