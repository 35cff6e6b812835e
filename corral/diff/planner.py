"""Running the offline plan (`corral.infra.plan`) for both sides of a diff.

Each plan runs the Pulumi program under mocks in its own worker process:
Pulumi's mock runtime is process-global state, and two workers use both
cores. The parent imports the plan module (and so Pulumi) before forking,
so the workers do not pay for the imports again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
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


def plan_pairs(items: list[tuple[str, Side | None, Side | None]], jobs: int = 2) -> list[tuple[Plan | None, Plan | None, str | None]]:
    """For each (cluster name, old side, new side): (old plan, new plan, error). A missing side plans empty."""
    try:
        import corral.infra.plan  # noqa: F401  (imported before forking, shared by the workers)
    except Exception as err:
        message = f"the offline plan is not available ({type(err).__name__}: {err})"
        return [(None, None, message) for _ in items]
    tasks = [(i, label, side) for i, (_, old, new) in enumerate(items)
             for label, side in (("old", old), ("new", new)) if side is not None]
    _preload({side[0].control_plane.cloud for _, _, side in tasks})
    results: dict[tuple[int, str], tuple[Plan | None, str | None]] = {}
    jobs = max(1, min(jobs, len(tasks), os.cpu_count() or 1))
    if jobs == 1:
        for i, label, (cluster, folder) in tasks:
            results[(i, label)] = _worker(cluster, str(folder))
    else:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {(i, label): pool.submit(_worker, cluster, str(folder)) for i, label, (cluster, folder) in tasks}
            for key, future in futures.items():
                results[key] = future.result()
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


def _preload(clouds: set[str]) -> None:
    """Import the clouds' packages (and SDKs) once, before the workers fork."""
    import importlib

    for cloud in clouds:
        try:
            importlib.import_module(f"corral.infra.{cloud}")
        except Exception:
            pass  # the worker reports it
