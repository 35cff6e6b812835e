"""Kueue objects checked against the CRDs of the pinned Kueue release, CEL rules included.

The CRDs in tests/manifests/kueue_crds/<release>/ are Kueue's own, byte for byte
(config/components/crd/bases/ of github.com/kubernetes-sigs/kueue at the release
tag; the folder's SOURCE file names the tag and commit). They are the oracle:
corral's add-on (corral/manifests/kueue.py) does not read them.

`validate_kueue_object(obj)` walks the object beside its version's
openAPIV3Schema the way the API server's structural schema validation does
(types, required, enum, pattern, lengths, item counts, minimum/maximum,
int-or-string, list-map keys) and refuses fields the schema does not have
(strict field validation: a typo would otherwise be pruned without a word).
At every node with `x-kubernetes-validations` it evaluates each CEL rule with
cel-python, `self` bound to the node's value. Transition rules (those naming
`oldSelf`) run only when an old object is given, as the API server runs them
only on updates.

Refresh the CRDs (a new pin: change KUEUE_RELEASE first):

    python -m tests.manifests.kueue_schema --refresh                 # from raw.githubusercontent.com
    python -m tests.manifests.kueue_schema --refresh --clone ~/kueue # from a local clone's tag
"""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from corral.util import write_atomic

# Kueue's release the add-on pins (corral/manifests/versions.py KUEUE); a test checks the two agree.
KUEUE_RELEASE = "v0.19.2"
CRD_ROOT = Path(__file__).resolve().parent / "kueue_crds"
CRD_DIR = CRD_ROOT / KUEUE_RELEASE
UPSTREAM_REPO = "kubernetes-sigs/kueue"
UPSTREAM_CRD_PATH = "config/components/crd/bases"
# Every CRD of the release but Workloads (650 kB; corral renders none: Kueue creates them).
CRD_FILES = tuple(f"kueue.x-k8s.io_{plural}.yaml" for plural in (
    "admissionchecks", "clusterqueues", "cohorts", "localqueues", "multikueueclusters", "multikueueconfigs",
    "provisioningrequestconfigs", "resourceflavors", "topologies", "workloadpriorityclasses",
))


# --- the CRDs ---------------------------------------------------------------------


@functools.cache
def schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema, every served version of every pinned CRD."""
    yaml = YAML(typ="safe", pure=True)
    found = {}
    for name in CRD_FILES:
        crd = yaml.load((CRD_DIR / name).read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                found[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return found


def cel_rules() -> list[tuple[str, str, str]]:
    """(apiVersion kind, schema path, rule) of every x-kubernetes-validations rule in the pinned CRDs."""
    found = []

    def walk(schema: dict, where: str, path: str) -> None:
        for rule in schema.get("x-kubernetes-validations", []):
            found.append((where, path or ".", rule["rule"]))
        for key, child in schema.get("properties", {}).items():
            walk(child, where, f"{path}.{key}")
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], where, f"{path}[*]")
        if isinstance(schema.get("additionalProperties"), dict):
            walk(schema["additionalProperties"], where, f"{path}[*]")

    for (api_version, kind), schema in schemas().items():
        walk(schema, f"{api_version} {kind}", "")
    return found


# --- CEL ----------------------------------------------------------------------------


@functools.cache
def _cel_program(rule: str):
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _uses_old_self(rule: str) -> bool:
    return re.search(r"\boldSelf\b", rule) is not None


def _evaluate(rule: str, value: Any, old: Any = None) -> Any:
    """The rule's result; raises celpy's CELEvalError when it cannot be evaluated."""
    import celpy

    activation = {"self": celpy.json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    return _cel_program(rule).evaluate(activation)


# --- the structural walk -----------------------------------------------------------

_JSON_TYPES = {
    "object": dict, "array": list, "string": str, "boolean": bool,
    "integer": int, "number": (int, float),
}


def _type_ok(value: Any, wanted: str) -> bool:
    if wanted in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _JSON_TYPES[wanted])


class _Walk:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path or '.'}: {message}")

    def node(self, schema: dict, value: Any, old: Any, path: str) -> None:
        if value is None:
            if not schema.get("nullable"):
                self.fail(path, "null is not allowed")
            return
        if schema.get("x-kubernetes-int-or-string"):
            if not isinstance(value, (int, str)) or isinstance(value, bool):
                self.fail(path, f"{value!r} is neither an integer nor a string")
                return
            if isinstance(value, str) and "pattern" in _string_branch(schema):
                self._pattern(_string_branch(schema)["pattern"], value, path)
        elif "type" in schema and not _type_ok(value, schema["type"]):
            self.fail(path, f"{value!r} is not of type {schema['type']}")
            return
        if "enum" in schema and value not in schema["enum"]:
            self.fail(path, f"{value!r} is not one of {schema['enum']}")
        if isinstance(value, str):
            self._string(schema, value, path)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                self.fail(path, f"{value} is less than the minimum {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                self.fail(path, f"{value} is more than the maximum {schema['maximum']}")
        if isinstance(value, dict):
            self._object(schema, value, old if isinstance(old, dict) else None, path)
        if isinstance(value, list):
            self._array(schema, value, old if isinstance(old, list) else None, path)
        self._rules(schema, value, old, path)

    def _pattern(self, pattern: str, value: str, path: str) -> None:
        # Kubernetes patterns are ECMA-262; the CRDs' patterns are also valid Python regexes,
        # but for a flag group after the anchor (AdmissionCheck's parameters.kind:
        # `^(?i)[a-z]...`, which Go's RE2 takes), which Python wants first.
        pattern = re.sub(r"\A\^\(\?([a-z]+)\)", r"(?\1)^", pattern)
        if re.search(pattern, value) is None:
            self.fail(path, f"{value!r} does not match {pattern}")

    def _string(self, schema: dict, value: str, path: str) -> None:
        if "pattern" in schema:
            self._pattern(schema["pattern"], value, path)
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            self.fail(path, f"longer than {schema['maxLength']} characters")
        if "minLength" in schema and len(value) < schema["minLength"]:
            self.fail(path, f"shorter than {schema['minLength']} characters")

    def _object(self, schema: dict, value: dict, old: dict | None, path: str) -> None:
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                self.fail(path, f"required field {key!r} is missing")
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            self.fail(path, f"more than {schema['maxProperties']} properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            child_old = old.get(key) if old else None
            if key in properties:
                self.node(properties[key], item, child_old, f"{path}.{key}")
            elif isinstance(extra, dict):
                self.node(extra, item, child_old, f"{path}.{key}")
            elif not (path == ".metadata" or schema.get("x-kubernetes-preserve-unknown-fields") or extra is True):
                self.fail(f"{path}.{key}", "unknown field (not in the CRD's schema)")

    def _array(self, schema: dict, value: list, old: list | None, path: str) -> None:
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.fail(path, f"more than {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            self.fail(path, f"fewer than {schema['minItems']} items")
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set" and len({repr(v) for v in value}) != len(value):
            self.fail(path, "duplicate items in a set")
        if list_type == "map":
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen = [tuple(item.get(k) for k in keys) for item in value if isinstance(item, dict)]
            if len(set(seen)) != len(seen):
                self.fail(path, f"duplicate entries for the map keys {keys}")
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                # Items' transition rules see the old item at the same index (Kubernetes
                # correlates list-map items by key; the rules corral's objects meet need none).
                child_old = old[index] if old and index < len(old) else None
                self.node(items, item, child_old, f"{path}[{index}]")

    def _rules(self, schema: dict, value: Any, old: Any, path: str) -> None:
        for validation in schema.get("x-kubernetes-validations", []):
            rule = validation["rule"]
            if _uses_old_self(rule) and old is None:
                continue  # a transition rule: the API server runs it on updates only
            import celpy

            try:
                result = _evaluate(rule, value, old)
            except celpy.CELEvalError as err:  # the API server refuses the object too
                self.fail(path, f"rule {rule!r} could not be evaluated: {err.args[0] if err.args else err}")
                continue
            if result is not True and str(result) != "True":
                message = validation.get("message") or f"failed rule: {rule}"
                if "messageExpression" in validation:
                    message = str(_evaluate(validation["messageExpression"], value, old))
                where = path + (validation.get("fieldPath") or "")
                self.fail(where, message)


def _string_branch(schema: dict) -> dict:
    return next((b for b in schema.get("anyOf", []) if b.get("type") == "string"), {})


def validate_kueue_object(obj: dict, old: dict | None = None) -> list[str]:
    """Problems of one Kueue object against the pinned release's CRD (empty: valid).

    Each problem is `<Kind>/<name>: <path>: <message>`. With `old`, the CRDs'
    transition rules (oldSelf) are evaluated too, as on an update of `old` to `obj`.
    """
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    name = (obj.get("metadata") or {}).get("name", "?")
    schema = schemas().get((api_version, kind))
    if schema is None:
        known = ", ".join(sorted(f"{k} {v}" for v, k in schemas()))
        return [f"{kind}/{name}: no CRD for {api_version} {kind} in Kueue {KUEUE_RELEASE} (has: {known})"]
    walk = _Walk()
    walk.node(schema, obj, old, "")
    return [f"{kind}/{name}: {problem}" for problem in walk.problems]


# --- refresh -----------------------------------------------------------------------


def _fetch(name: str, clone: Path | None) -> tuple[str, str]:
    """(text, where from) of one CRD file of KUEUE_RELEASE."""
    path = f"{UPSTREAM_CRD_PATH}/{name}"
    if clone is not None:
        text = subprocess.run(["git", "-C", str(clone), "show", f"{KUEUE_RELEASE}:{path}"],
                              capture_output=True, text=True, check=True).stdout
        return text, f"{clone} (git) {KUEUE_RELEASE}:{path}"
    url = f"https://raw.githubusercontent.com/{UPSTREAM_REPO}/{KUEUE_RELEASE}/{path}"
    with urllib.request.urlopen(url, timeout=60) as response:  # a fixed https URL
        return response.read().decode(), url


def refresh(clone: Path | None) -> None:
    CRD_DIR.mkdir(parents=True, exist_ok=True)
    for name in CRD_FILES:
        text, source = _fetch(name, clone)
        write_atomic(CRD_DIR / name, text)
        print(f"{CRD_DIR / name} <- {source}")
    commit = ""
    if clone is not None:
        commit = subprocess.run(["git", "-C", str(clone), "rev-parse", f"{KUEUE_RELEASE}^{{commit}}"],
                                capture_output=True, text=True, check=True).stdout.strip()
    write_atomic(CRD_DIR / "SOURCE", (
        f"github.com/{UPSTREAM_REPO} tag {KUEUE_RELEASE}{' commit ' + commit if commit else ''}\n"
        f"files: {UPSTREAM_CRD_PATH}/<name>, unchanged\n"
    ))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--refresh", action="store_true", help=f"re-fetch the CRDs of Kueue {KUEUE_RELEASE}")
    parser.add_argument("--clone", type=Path, help="a local clone of kubernetes-sigs/kueue to read the tag from")
    args = parser.parse_args(argv)
    if not args.refresh:
        parser.print_help()
        return 2
    refresh(args.clone)
    return 0


if __name__ == "__main__":
    sys.exit(main())
