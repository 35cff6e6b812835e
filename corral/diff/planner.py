"""Running the offline plan (`corral.infra.plan`) for both sides of a diff.

Each plan runs the Pulumi program under mocks in its own worker process:
Pulumi's mock runtime is process-global state, and two workers use both
cores. The parent imports the plan module (and so Pulumi) before forking,
so the workers do not pay for the imports again (a parent with threads
uses a preloaded fork server instead: see `_worker_context`).

Plans are cached on disk (env CORRAL_PLAN_CACHE: a folder, or `off`;
default ~/.cache/corral/plans), keyed by everything a plan depends on: the
resolved cluster model, its stack settings file, corral's own source and
templates, and the installed Pulumi SDK versions. The base side of a
review rarely changes between runs, so a second `corral diff` plans only
what was edited.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

Plan = list[dict[str, Any]]


def _as_dict(resource: Any) -> dict[str, Any]:
    if isinstance(resource, dict):
        data = dict(resource)
    elif dataclasses.is_dataclass(resource):
        data = dataclasses.asdict(resource)
    else:
        data = {k: getattr(resource, k) for k in dir(resource) if not k.startswith("_") and not callable(getattr(resource, k))}
    data.setdefault("parent", None)
    data.setdefault("protect", False)
    data.setdefault("inputs", {})
    return data


def run_plan(cluster: Any, clusters: Path) -> Plan:
    """Every resource the program registers for `cluster` (a validated model) of the fleet in `clusters`."""
    from corral.infra import plan as infra_plan

    with _identities_unmasked(infra_plan):
        result = infra_plan.plan_stack(cluster, clusters)
    return [_as_dict(r) for r in result.resources]


@contextlib.contextmanager
def _identities_unmasked(infra_plan: Any):
    """Keep resource types and names out of the plan's secret scrubbing.

    The plan masks any string that contains a secret's plaintext, and some
    secret inputs hold machine names ("jaguar-etcd-0" inside a VM's secret
    OS profile), so resource *names* came out as "[secret]" and could not be
    matched between the two sides. Matching needs the names; only inputs
    are scrubbed here. (To be dropped once plan.py scrubs inputs only.)
    """
    masker = getattr(infra_plan, "Masker", None)
    original = getattr(masker, "scrub", None)
    if original is None:
        yield
        return

    def scrub(self: Any, value: Any) -> Any:
        if isinstance(value, list) and value and all(isinstance(r, dict) and "inputs" in r for r in value):
            return [{**r, "inputs": original(self, r["inputs"])} for r in value]
        return original(self, value)

    masker.scrub = scrub
    try:
        yield
    finally:
        masker.scrub = original


def _worker(cluster: Any, clusters: str) -> tuple[Plan | None, str | None]:
    try:
        return run_plan(cluster, Path(clusters)), None
    except Exception as err:  # the program's errors are for the reviewer to read
        return None, f"{type(err).__name__}: {err}"


Side = tuple[Any, Path]  # (validated Cluster model, its clusters folder)


CACHE_ENV = "CORRAL_PLAN_CACHE"
CACHE_KEEP = 200  # plans kept; older ones are pruned
_PULUMI_PACKAGES = ("pulumi", "pulumi-azure-native", "pulumi-aws", "pulumi-gcp", "pulumi-tls", "pulumi-random")


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() in ("0", "off", "no", "false"):
        return None
    if value:
        return Path(value)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "corral" / "plans"


_FINGERPRINT: str | None = None


def code_fingerprint() -> str:
    """A hash of corral's source and templates and of the Pulumi SDK versions."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        from importlib import metadata

        digest = hashlib.sha256()
        package = Path(__file__).resolve().parents[1]
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc",):
                digest.update(path.relative_to(package).as_posix().encode() + b"\0")
                digest.update(path.read_bytes())
        for name in _PULUMI_PACKAGES:
            try:
                digest.update(f"{name}={metadata.version(name)}".encode())
            except metadata.PackageNotFoundError:
                digest.update(f"{name}=none".encode())
        _FINGERPRINT = digest.hexdigest()
    return _FINGERPRINT


def _stack_file(name: str, clusters: Path) -> Path | None:
    """Where `corral.infra.plan.stack_config_file` finds the stack settings (same order)."""
    candidates = [Path(clusters).resolve().parent / "stacks"]
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        root = next((f for f in (start, *start.parents) if (f / "Pulumi.yaml").is_file()), None)
        if root is not None:
            candidates.append(root / "stacks")
            break
    candidates.append(Path(__file__).resolve().parents[2] / "stacks")
    for folder in candidates:
        if (folder / f"Pulumi.{name}.yaml").is_file():
            return folder / f"Pulumi.{name}.yaml"
    return None


def cache_key(cluster: Any, clusters: Path) -> str:
    stack = _stack_file(cluster.name, clusters)
    digest = hashlib.sha256(code_fingerprint().encode())
    digest.update(cluster.model_dump_json(by_alias=True).encode())
    digest.update(stack.read_bytes() if stack is not None else b"(no stack file)")
    return digest.hexdigest()


def _cache_get(folder: Path | None, key: str) -> Plan | None:
    if folder is None:
        return None
    path = folder / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        os.utime(path)  # recently used: kept by the pruning
        return data
    except (OSError, ValueError):
        return None


def _cache_put(folder: Path | None, key: str, plan: Plan) -> None:
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(plan))
        os.replace(tmp, folder / f"{key}.json")
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-CACHE_KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a cache that cannot be written is no cache, not an error


def plan_pairs(items: list[tuple[str, Side | None, Side | None]], jobs: int = 2, use_cache: bool = True) -> list[tuple[Plan | None, Plan | None, str | None]]:
    """For each (cluster name, old side, new side): (old plan, new plan, error). A missing side plans empty."""
    tasks = [(i, label, side) for i, (_, old, new) in enumerate(items)
             for label, side in (("old", old), ("new", new)) if side is not None]
    results: dict[tuple[int, str], tuple[Plan | None, str | None]] = {}
    cache = cache_dir() if use_cache else None
    keys = {(i, label): cache_key(side[0], side[1]) for i, label, side in tasks} if cache else {}
    pending = []
    for i, label, side in tasks:
        cached = _cache_get(cache, keys[(i, label)]) if cache else None
        if cached is not None:
            results[(i, label)] = (cached, None)
        else:
            pending.append((i, label, side))
    tasks = pending
    if tasks:
        try:
            import corral.infra.plan  # noqa: F401  (imported before forking, shared by the workers)
        except Exception as err:
            message = f"the offline plan is not available ({type(err).__name__}: {err})"
            return [(None, None, message) for _ in items]
        _preload({side[0].control_plane.cloud for _, _, side in tasks})
    jobs = max(1, min(jobs, len(tasks), os.cpu_count() or 1))
    if not tasks:
        pass
    elif jobs == 1:
        for i, label, (cluster, folder) in tasks:
            results[(i, label)] = _worker(cluster, str(folder))
    else:
        context = _worker_context({side[0].control_plane.cloud for _, _, side in tasks})
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {(i, label): pool.submit(_worker, cluster, str(folder)) for i, label, (cluster, folder) in tasks}
            for key, future in futures.items():
                results[key] = future.result()
    for i, label, _ in tasks:
        plan, error = results[(i, label)]
        if cache and error is None and plan is not None:
            _cache_put(cache, keys[(i, label)], plan)
    out = []
    for i, (name, _, _) in enumerate(items):
        old_plan, old_error = results.get((i, "old"), ([], None))
        new_plan, new_error = results.get((i, "new"), ([], None))
        error = None
        if old_error:
            error = f"plan of {name} at the base revision failed: {old_error}"
        if new_error:
            error = f"plan of {name} failed: {new_error}"
        out.append((old_plan, new_plan, error))
    return out


def _worker_context(clouds: set[str]) -> multiprocessing.context.BaseContext:
    """`fork` from a single-threaded parent (the CLI: workers inherit the
    imports for free); else `forkserver`, preloaded with the same modules.
    Forking a process with threads - a parent that already ran a Pulumi
    program in-process has gRPC threads - can hang the child on a lock
    some thread held at the fork."""
    if threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["corral.infra.plan", *(f"corral.infra.{cloud}" for cloud in sorted(clouds))])
    return context


def _preload(clouds: set[str]) -> None:
    """Import the clouds' packages (and SDKs) once, before the workers fork."""
    import importlib

    for cloud in clouds:
        try:
            importlib.import_module(f"corral.infra.{cloud}")
        except Exception:
            pass  # the worker reports it
