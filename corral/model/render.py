"""Writing the model back out: the resolved definition and the JSON Schema."""

from __future__ import annotations

import io
import json
from typing import Any

from ruamel.yaml import YAML

from .schema import Cluster, OnPremPool

SCHEMA_ID = "https://corral.dev/schemas/cluster-v1.json"


def resolved(cluster: Cluster, expand_hosts: bool = False) -> dict[str, Any]:
    """The cluster as the file would read with every default written out."""
    data = cluster.model_dump(mode="json", by_alias=True, exclude_none=True)
    for pool, pool_data in zip(cluster.node_pools, data["nodePools"]):
        if isinstance(pool, OnPremPool):
            pool_data["hostCount"] = pool.capacity
            if expand_hosts:
                pool_data["hosts"] = pool.host_names
    return data


def dump_yaml(data: Any) -> str:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False
    stream = io.StringIO()
    yaml.dump(data, stream)
    return stream.getvalue()


def json_schema() -> dict[str, Any]:
    schema = Cluster.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "corral cluster definition (clusters/<name>.yaml)",
    }


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"
