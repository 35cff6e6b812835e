"""Every field of the cluster file has hover text: the model's own description,
carried into the JSON Schema (issue 26, item 5)."""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel

from corral.model import schema as cluster_schema
from corral.model.render import json_schema

from .helpers import EXAMPLES

# Keywords under which a JSON Schema nests further schemas.
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else")


def undescribed_properties(root: dict[str, Any], root_name: str = "Cluster") -> list[str]:
    """Paths (`Definition.property`) of every property without a non-empty description,
    in every object schema reachable from `root`: its properties, $defs, $refs and anyOf branches."""
    missing: list[str] = []
    seen_refs: set[str] = set()

    def resolve(ref: str) -> tuple[str, dict[str, Any]]:
        assert ref.startswith("#/$defs/"), f"unexpected $ref {ref}"
        name = ref.removeprefix("#/$defs/")
        return name, root["$defs"][name]

    def visit(node: Any, where: str) -> None:
        if not isinstance(node, dict):
            return
        if "$ref" in node and node["$ref"] not in seen_refs:
            seen_refs.add(node["$ref"])
            name, target = resolve(node["$ref"])
            visit(target, name)
        for prop, sub in node.get("properties", {}).items():
            description = sub.get("description") if isinstance(sub, dict) else None
            if not (isinstance(description, str) and description.strip()):
                missing.append(f"{where}.{prop}")
            visit(sub, f"{where}.{prop}")
        for key in _SUBSCHEMA_LISTS:
            for branch in node.get(key, []):
                visit(branch, where)
        for key in _SUBSCHEMA_VALUES:
            visit(node.get(key), where)

    visit(root, root_name)
    # Definitions nothing refers to are still part of the published schema.
    for name, definition in root.get("$defs", {}).items():
        ref = f"#/$defs/{name}"
        if ref not in seen_refs:
            seen_refs.add(ref)
            visit(definition, name)
    return sorted(set(missing))


def test_walker_finds_properties_behind_refs_and_any_of():
    # The walker must see a property nested in a $ref'd definition reached
    # only through anyOf, or the real test below would pass vacuously.
    schema = {
        "properties": {
            "described": {"type": "string", "description": "has hover text"},
            "blank": {"type": "string", "description": "  "},
            "maybe": {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}], "description": "an inner block"},
        },
        "$defs": {
            "Inner": {"properties": {"bare": {"type": "integer"},
                                     "listed": {"type": "array", "items": {"$ref": "#/$defs/Leaf"},
                                                "description": "leaves"}}},
            "Leaf": {"properties": {"deep": {"type": "boolean"}}},
        },
    }
    assert undescribed_properties(schema, "Root") == ["Inner.bare", "Leaf.deep", "Root.blank"]


def test_every_property_of_the_generated_schema_has_a_description():
    missing = undescribed_properties(json_schema())
    assert not missing, "fields without description= in corral/model/schema.py: " + ", ".join(missing)


def _reachable_models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model class a field of `root` holds, however nested (lists, unions, Annotated), by class
    name: the cluster file's sections live in schema.py and in modules of their own (auto_repair, ...)."""
    found: dict[str, type[BaseModel]] = {}

    def walk(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation.__name__ not in found:
                found[annotation.__name__] = annotation
                for field in annotation.model_fields.values():
                    walk(field.annotation)
            return
        for argument in typing.get_args(annotation):
            walk(argument)

    walk(root)
    return found


def _models_in_schema(committed: dict[str, Any]) -> dict[str, type[BaseModel]]:
    """The model classes behind the schema's root and definitions, by definition name."""
    reachable = _reachable_models(cluster_schema.Cluster)
    models: dict[str, type[BaseModel]] = {"Cluster": cluster_schema.Cluster}
    for name in committed["$defs"]:
        model = reachable.get(name)
        assert model is not None, f"$defs/{name} is no model the Cluster model holds"
        models[name] = model
    return models


def test_committed_schema_carries_each_fields_own_description():
    # What an editor shows on hover comes from clusters/schema.json, not from
    # the code: every field's description must have reached the committed file.
    committed = json.loads((EXAMPLES / "schema.json").read_text())
    assert not undescribed_properties(committed)
    differing = []
    for name, model in _models_in_schema(committed).items():
        properties = committed["properties"] if name == "Cluster" else committed["$defs"][name]["properties"]
        for field_name, field in model.model_fields.items():
            key = field.alias or field_name
            shown = properties[key].get("description")
            if not field.description or shown != field.description:
                differing.append(f"{name}.{key}: model {field.description!r}, schema.json {shown!r}")
    assert not differing, "\n".join(differing)


def test_hover_text_states_units_and_defaults_where_the_field_has_them():
    # Spot checks of the wording, taken from the docs: the unit and the default
    # an editor's hover must show for fields whose value is a quantity.
    properties = json_schema()["$defs"]
    iops = properties["EtcdDisk"]["properties"]["iops"]["description"]
    assert "per GiB" in iops and "3,000" in iops
    assert "GiB" in properties["EtcdDisk"]["properties"]["sizeGiB"]["description"]
    assert "default 8472" in properties["Flannel"]["properties"]["port"]["description"]
    assert "odd, 3..7" in properties["Etcd"]["properties"]["members"]["description"]
