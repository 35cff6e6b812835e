"""Offline validation of rendered objects against Kubernetes' API schemas.

Uses the kubernetes-validate package's bundled OpenAPI-derived JSON schemas,
in strict mode (unknown fields are errors, as `kubectl apply --validate=strict`
would report them). Imported only by commands and tests that validate.
"""

from __future__ import annotations

from dataclasses import dataclass

from .render import object_key


@dataclass(frozen=True)
class SchemaVersion:
    wanted: str  # the cluster's minor, e.g. "1.31"
    used: str  # the schema set validated against
    note: str | None  # why `used` differs from `wanted`, if it does


def _minor_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def schema_version(kubernetes_version: str) -> SchemaVersion:
    """The schema set for a cluster: its own minor, else the nearest one shipped.

    Nearest older is preferred (an object valid for an older API is accepted by
    a newer one unless it uses a removed API, which this would then miss); a
    cluster older than every schema set uses the oldest.
    """
    from kubernetes_validate.utils import all_versions

    wanted = ".".join(kubernetes_version.split(".")[:2])
    shipped = {".".join(v.split(".")[:2]) for v in all_versions()}
    if wanted in shipped:
        return SchemaVersion(wanted, wanted, None)
    ordered = sorted(shipped, key=_minor_tuple)
    older = [v for v in ordered if _minor_tuple(v) < _minor_tuple(wanted)]
    used = older[-1] if older else ordered[0]
    return SchemaVersion(
        wanted, used,
        f"kubernetes-validate ships no schemas for {wanted}; validated against {used}, the nearest it has",
    )


# API groups of add-ons' own CRDs, which kubernetes-validate has no schemas for:
# tests/manifests/test_kueue.py checks these objects against the pinned Kueue
# release's CRDs, CEL rules included (tests/manifests/kueue_schema.py).
CUSTOM_API_GROUPS = frozenset({"kueue.x-k8s.io"})


def validate_objects(objects: list[dict], kubernetes_version: str) -> tuple[SchemaVersion, list[str]]:
    """(schema version used, one problem line per invalid object; empty when all pass)."""
    import kubernetes_validate

    version = schema_version(kubernetes_version)
    problems = []
    for obj in objects:
        if obj["apiVersion"].split("/")[0] in CUSTOM_API_GROUPS:
            continue
        try:
            kubernetes_validate.validate(obj, f"{version.used}.0", strict=True)
        except kubernetes_validate.ValidationError as err:
            where = "/".join(str(p) for p in err.path) or "(top)"
            problems.append(f"{object_key(obj)}: {where}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            problems.append(f"{object_key(obj)}: {err.message}")
    return version, problems
