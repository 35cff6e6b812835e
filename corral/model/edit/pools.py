"""Node pool operations on a cluster file's text (add, scale, remove, read) and
team reservations of pools (scheduling.teams[].reservedPools)."""

from __future__ import annotations

from typing import Any

from ..gpu_catalog import gpu_machine
from ..schema import CloudPool, Gpu, OnPremPool, Roce
from .errors import CANONICAL_POOL_KEYS, POOLS_KEY, EditError
from .spans import Node, _column, _dash_of, _data, _line_end, _tree
from .splice import (
    _append_flow_item,
    _check,
    _remove_block_item,
    _remove_flow_item,
    _set_value,
    _splice,
    append_section_item,
)
from .style import _hints_from, _key_order, _ordered, detect_style, render_scalar


def _pool_index(root: Node, name: str) -> tuple[Node, Node, int]:
    pair = root.get(POOLS_KEY)
    if pair is None or pair[1].kind != "seq":
        raise EditError(f"no pool named '{name}' (the file has no {POOLS_KEY})")
    key, seq = pair
    for i, item in enumerate(seq.items):
        if item.kind == "map" and (n := item.value_of("name")) is not None and n.value == name:
            return key, seq, i
    names = [n.value for item in seq.items if item.kind == "map" and (n := item.value_of("name")) is not None]
    raise EditError(f"no pool named '{name}' (pools: {', '.join(names) or 'none'})")


def _team_node(root: Node, team: str) -> Node:
    scheduling = root.value_of("scheduling")
    teams = scheduling.value_of("teams") if scheduling is not None and scheduling.kind == "map" else None
    names = []
    for item in teams.items if teams is not None and teams.kind == "seq" else []:
        n = item.value_of("name") if item.kind == "map" else None
        if n is not None:
            names.append(n.value)
            if n.value == team:
                return item
    raise EditError(
        f"no team '{team}' in scheduling.teams (teams: {', '.join(names) or 'none'}); "
        "add the team (with its namespaces) first"
    )


# --- Public operations --------------------------------------------------------


def pool_document(provider: str, name: str, **fields: Any) -> dict[str, Any]:
    """A pool as the file writes it, from the model's Python field names.

    `fields` uses the schema's snake_case names (machine_type, min_size,
    gpu=dict(model=..., fabric_manager=...)); None values are left out, so
    the file says only what was asked for and defaults stay defaults.
    """
    model = OnPremPool if provider == "onprem" else CloudPool
    if provider != "onprem" and "machine_type" in fields:
        fields["gpu"] = machine_gpu(provider, fields["machine_type"], fields.get("gpu"))
    out: dict[str, Any] = {"name": name, "provider": provider}
    for key, value in fields.items():
        if value is None:
            continue
        info = model.model_fields.get(key)
        yaml_key = (info.alias if info is not None and info.alias else None) or _camel(key)
        if key in ("gpu", "roce") and isinstance(value, dict):
            sub = Gpu if key == "gpu" else Roce
            value = {
                (sub.model_fields[k].alias if k in sub.model_fields and sub.model_fields[k].alias else _camel(k)): v
                for k, v in value.items() if v is not None
            }
        out[yaml_key] = value
    return out


def machine_gpu(provider: str, machine_type: str | None, gpu: dict[str, Any] | None) -> dict[str, Any] | None:
    """A cloud pool's gpu fields with what its machine type has filled in
    (gpu_catalog): model and count, and fabric manager where NVSwitch joins
    the GPUs, so the file says what the pool runs. Given fields are kept (the
    rules check them); machine types the catalog lacks keep `gpu` as given."""
    machine = gpu_machine(provider, machine_type) if machine_type else None
    if machine is None:
        return gpu
    given = {k: v for k, v in (gpu or {}).items() if v is not None}
    filled: dict[str, Any] = {"model": machine.gpu_model, "count": machine.gpu_count}
    if machine.nvswitch:
        filled["fabric_manager"] = True
    return {**filled, **given}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def add_pool(text: str, pool: dict[str, Any], reserved_for: str | None = None) -> str:
    """The file with `pool` (YAML keys) appended to nodePools, in the file's style."""
    data = _data(text)
    if not isinstance(data, dict):
        raise EditError("a cluster file must be a YAML mapping")
    root = _tree(text)
    style = detect_style(text, root)
    pair = root.get(POOLS_KEY)
    siblings = pair[1].items if pair is not None and pair[1].kind == "seq" else []
    if any(s.kind == "map" and (n := s.value_of("name")) is not None and n.value == pool["name"] for s in siblings):
        raise EditError(f"pool '{pool['name']}' already exists")
    same_kind = [s for s in siblings if s.kind == "map" and
                 ((p := s.value_of("provider")) is not None and (p.value == "onprem") == (pool.get("provider") == "onprem"))]
    hints = _hints_from(same_kind + [s for s in siblings if s not in same_kind])
    pool = _ordered(pool, _key_order(same_kind or siblings))

    new = append_section_item(text, root, POOLS_KEY, pool, style, hints)
    expected = dict(data)
    expected[POOLS_KEY] = list(data.get(POOLS_KEY) or []) + [pool]
    new = _check(new, expected, "adding the pool")
    if reserved_for:
        new = reserve_pool(new, reserved_for, pool["name"])
    return new


def reserve_pool(text: str, team: str, pool_name: str) -> str:
    """The file with `pool_name` added to `team`'s reservedPools."""
    data = _data(text)
    root = _tree(text)
    style = detect_style(text, root)
    node = _team_node(root, team)
    reserved = node.value_of("reservedPools")
    if reserved is not None and reserved.kind == "seq" and any(i.value == pool_name for i in reserved.items):
        return text
    if reserved is None:
        order = ["name", "namespaces", "reservedPools"]
        new = _set_value(text, node, "reservedPools", [pool_name], style, order)
    elif reserved.kind != "seq":
        raise EditError(f"team '{team}': reservedPools must be a list")
    elif reserved.flow or not reserved.items:
        quote = reserved.items[0].style if reserved.items else None
        new = _append_flow_item(text, reserved, render_scalar(pool_name, quote, style.quote))
    else:
        dash = _dash_of(text, reserved.items[0])
        quote = reserved.items[0].style
        line = " " * _column(text, dash) + "- " + render_scalar(pool_name, quote, style.quote)
        at = _line_end(text, reserved.items[-1].end - 1)
        new = _splice(text, at, at, ("" if text[:at].endswith("\n") else "\n") + line + "\n")
    expected = data
    for entry in expected["scheduling"]["teams"]:
        if entry.get("name") == team:
            entry["reservedPools"] = list(entry.get("reservedPools") or []) + [pool_name]
    return _check(new, expected, f"reserving the pool for team '{team}'")


def remove_pool(text: str, name: str) -> str:
    """The file without pool `name`; refused while a team reserves it."""
    data = _data(text)
    teams = ((data.get("scheduling") or {}).get("teams") or []) if isinstance(data, dict) else []
    holders = [t.get("name") for t in teams if isinstance(t, dict) and name in (t.get("reservedPools") or [])]
    if holders:
        raise EditError(
            f"pool '{name}' is reserved by team{'s' * (len(holders) > 1)} {', '.join(map(str, holders))} "
            "(scheduling.teams[].reservedPools); remove the reservation first"
        )
    root = _tree(text)
    key, seq, index = _pool_index(root, name)
    if seq.flow:
        new = _remove_flow_item(text, seq, index)
    else:
        new = _remove_block_item(text, key, seq, index)
    expected = dict(data)
    expected[POOLS_KEY] = [p for i, p in enumerate(data[POOLS_KEY]) if i != index]
    return _check(new, expected, "removing the pool")


def update_pool(text: str, name: str, changes: dict[str, Any]) -> str:
    """The file with pool `name`'s keys (YAML names) set to new values, styles kept."""
    data = _data(text)
    new = text
    for key, value in changes.items():
        root = _tree(new)
        style = detect_style(new, root)
        _, seq, index = _pool_index(root, name)
        item = seq.items[index]
        if item.kind != "map":
            raise EditError(f"pool '{name}' is not a mapping")
        new = _set_value(new, item, key, value, style, list(CANONICAL_POOL_KEYS))
        data[POOLS_KEY][index][key] = value
    return _check(new, data, f"changing pool '{name}'")


def pool_data(text: str, name: str) -> dict[str, Any] | None:
    """Pool `name` as the text holds it (plain data), or None."""
    return next((p for p in pools_of(text) if isinstance(p, dict) and p.get("name") == name), None)


def pools_of(text: str) -> list[dict[str, Any]]:
    data = _data(text)
    return list((data or {}).get(POOLS_KEY) or []) if isinstance(data, dict) else []
