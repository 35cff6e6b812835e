"""`corral diff`: every cluster file that differs between a git revision and the working tree.

For each: the semantic change (from the two resolved models) and the plan
change (the offline Pulumi plan of both sides, classified). The old side's
plan runs against the fleet as it was at the base revision, written to a
temporary clusters folder.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from corral.model import Cluster, ValidationFailed
from corral.model.document import Document
from corral.model.loader import CLUSTER_SUFFIX, load_fleet, parse_document

from . import git, semantic
from .resources import ResourceChange, classify, counts


@dataclass
class ClusterDiff:
    name: str
    status: str  # added | removed | modified
    semantic: list[semantic.Change] = field(default_factory=list)
    resources: list[ResourceChange] | None = None
    plan_error: str | None = None
    problems: list[str] = field(default_factory=list)  # the working tree's validation problems
    base_problems: list[str] = field(default_factory=list)
    onprem_pools: list[str] = field(default_factory=list)
    cloud: str | None = None

    @property
    def dangers(self) -> list[ResourceChange]:
        return [r for r in self.resources or [] if r.danger]

    @property
    def counts(self) -> dict[str, int]:
        return counts(self.resources or [])


@dataclass
class Report:
    base: str | None
    base_label: str
    base_short: str
    clusters: list[ClusterDiff] = field(default_factory=list)

    @property
    def dangerous(self) -> bool:
        return any(c.dangers for c in self.clusters)

    @property
    def invalid(self) -> bool:
        return any(c.problems for c in self.clusters)


def _models(folder: Path, names: set[str], display_prefix: str = "") -> tuple[dict[str, Cluster], dict[str, list[str]]]:
    """Models of `names` in `folder`, with the fleet's rules where the fleet validates."""
    models: dict[str, Cluster] = {}
    problems: dict[str, list[str]] = {}
    try:
        fleet = load_fleet([folder])
        return {n: fleet.clusters[n] for n in names if n in fleet.clusters}, {}
    except ValidationFailed as failed:
        for problem in failed.problems:
            owner = Path(problem.file).name.removesuffix(CLUSTER_SUFFIX)
            problems.setdefault(owner, []).append(display_prefix + str(problem).removeprefix(str(folder) + "/"))
    for name in names:
        path = folder / f"{name}{CLUSTER_SUFFIX}"
        if not path.is_file():
            continue
        try:
            models[name] = parse_document(Document.read(path))
        except ValidationFailed:
            continue
    return models, problems


def compute(clusters: Path, base: str | None = None, plan: bool = True, jobs: int = 2, cache: bool = True) -> Report:
    """The diff of the cluster files in `clusters` against `base` (default: merge base with main)."""
    clusters = clusters.resolve()
    root = git.repo_root(clusters)
    rel = clusters.relative_to(root).as_posix()
    if base is None:
        rev, label = git.default_base(root)
    else:
        rev = git.resolve(root, base)
        if rev is None:
            raise git.GitError(f"unknown revision '{base}' (try `git fetch` or a branch/commit that exists)")
        label = base
    report = Report(rev, label, git.short(root, rev))
    old_files = git.files_at(root, rev, rel, CLUSTER_SUFFIX)
    new_files = {p.name: p.read_bytes() for p in sorted(clusters.glob(f"*{CLUSTER_SUFFIX}")) if p.is_file()}
    changed = sorted(
        name.removesuffix(CLUSTER_SUFFIX)
        for name in set(old_files) | set(new_files)
        if old_files.get(name) != new_files.get(name)
    )
    if not changed:
        return report
    with tempfile.TemporaryDirectory(prefix="corral-diff-") as tmp:
        old_dir = Path(tmp) / rel
        old_dir.mkdir(parents=True)
        for name, data in old_files.items():
            (old_dir / name).write_bytes(data)
        # The base revision's stack settings, where the plan looks for them (beside clusters/).
        stacks_rel = (Path(rel).parent / "stacks").as_posix()
        old_stacks = git.files_at(root, rev, stacks_rel, ".yaml")
        if old_stacks:
            (old_dir.parent / "stacks").mkdir(exist_ok=True)
            for name, data in old_stacks.items():
                (old_dir.parent / "stacks" / name).write_bytes(data)
        names = set(changed)
        old_models, old_problems = _models(old_dir, names, f"{rel}@{report.base_short}: ")
        new_models, new_problems = _models(clusters, names)
        for name in changed:
            file = f"{name}{CLUSTER_SUFFIX}"
            status = "added" if file not in old_files else "removed" if file not in new_files else "modified"
            old, new = old_models.get(name), new_models.get(name)
            diff = ClusterDiff(name, status, problems=new_problems.get(name, []),
                               base_problems=old_problems.get(name, []))
            diff.cloud = (new or old).control_plane.cloud if (new or old) else None
            diff.semantic = semantic.compare(old, new) if (old or status == "added") and (new or status == "removed") else []
            diff.onprem_pools = semantic.changed_onprem_pools(old, new)
            report.clusters.append(diff)
        if plan:
            _plan_all(report, old_dir, clusters, old_models, new_models, jobs, cache)
    return report


def _plan_all(report: Report, old_dir: Path, new_dir: Path, old_models: dict, new_models: dict, jobs: int,
              cache: bool) -> None:
    from . import planner

    work = []
    for diff in report.clusters:
        old, new = old_models.get(diff.name), new_models.get(diff.name)
        if diff.status != "removed" and new is None:
            diff.plan_error = "the cluster file does not validate; fix it to see the plan"
            continue
        if diff.status != "added" and old is None:
            diff.plan_error = ("the cluster file at the base revision does not validate with today's model, "
                               "so its plan cannot be compared")
            continue
        work.append((diff, (old, old_dir) if old is not None else None, (new, new_dir) if new is not None else None))
    results = planner.plan_pairs([(d.name, o, n) for d, o, n in work], jobs=jobs, use_cache=cache)
    for (diff, _, _), (old_plan, new_plan, error) in zip(work, results):
        if error:
            diff.plan_error = error
            continue
        diff.resources = classify(old_plan, new_plan)
