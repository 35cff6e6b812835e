"""A team may not have a namespace an add-on owns, or Kubernetes' own (issue 27 item 2, review).

A team's namespace gets the team's Pod Security level and tolerations whitelist, and the placement
policy exempts some add-on namespaces: a team listing `corral-repair`, `kueue-system` or
`corral-monitoring` would relabel the add-on's namespace or run its pods where the add-on's are
exempt. The cluster file's rule says so with file, line and field; the manifests' policy refuses it
for a cluster built without the loader. Both read one list, corral/model/namespaces.py, which the
last tests hold to what the add-ons really render.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from corral.certs import multikueue as multikueue_certs
from corral.health import repair_protocol
from corral.manifests import all_objects, kueue, policy, render
from corral.model import Cluster, ValidationFailed, load_fleet
from corral.model.namespaces import ADDON_NAMESPACES, KUBERNETES_NAMESPACES

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"
# Namespaces today's add-ons own beyond the exempt SYSTEM_NAMESPACES: the ones the old check let by.
NOT_EXEMPT_ADDON_NAMESPACES = ["corral-repair", "kueue-system"]


def problems_of(tmp_path: Path, name: str, old: str, new: str) -> list[str]:
    text = (EXAMPLES / f"{name}.yaml").read_text()
    assert old in text
    folder = tmp_path / "fleet"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(text.replace(old, new, 1))
    try:
        load_fleet([folder])
    except ValidationFailed as failed:
        return [str(p).removeprefix(str(folder) + "/") for p in failed.problems]
    return []


def line_of(name: str, needle: str) -> int:
    for number, line in enumerate((EXAMPLES / f"{name}.yaml").read_text().splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(needle)


@pytest.mark.parametrize("namespace", [*NOT_EXEMPT_ADDON_NAMESPACES, "corral-monitoring", "kube-flannel",
                                       "kube-system", "default", "kube-anything"])
def test_the_cluster_file_refuses_a_team_namespace_an_addon_or_kubernetes_owns(tmp_path, namespace):
    found = problems_of(tmp_path, "jaguar", "namespaces: [robotics]", f"namespaces: [robotics, {namespace}]")
    assert len(found) == 1, found
    (problem,) = found
    line = line_of("jaguar", "namespaces: [robotics]")
    assert problem.startswith(f"jaguar.yaml:{line}:"), problem
    assert f"scheduling.teams[0].namespaces[1]: namespace '{namespace}' is " in problem
    assert "a team's namespaces must be its own" in problem


def test_the_addon_is_named_in_the_message(tmp_path):
    (problem,) = problems_of(tmp_path, "heron", "namespaces: [robotics]", "namespaces: [corral-repair]")
    assert "scheduling.teams[1].namespaces[0]: namespace 'corral-repair' is the repair add-on's own namespace" in problem


def test_a_namespace_of_the_teams_own_still_loads(tmp_path):
    assert problems_of(tmp_path, "jaguar", "namespaces: [robotics]", "namespaces: [robotics, robotics-ci]") == []


def cluster_bypassing_the_loader(name: str, extra_namespace: str) -> Cluster:
    """Example `name`, its first team given `extra_namespace`, validated by the schema only (as a
    program building a Cluster itself would): the policy's own check must still hold."""
    data = YAML(typ="safe").load((EXAMPLES / f"{name}.yaml").read_text())
    data["scheduling"]["teams"][0]["namespaces"].append(extra_namespace)
    return Cluster.model_validate(data)


@pytest.mark.parametrize("namespace", NOT_EXEMPT_ADDON_NAMESPACES)
def test_the_policy_refuses_it_without_the_loader(namespace):
    cluster = cluster_bypassing_the_loader("heron", namespace)
    with pytest.raises(policy.ManifestError, match=f"'{namespace}', the .* add-on's own namespace"):
        policy.team_namespaces(cluster)
    with pytest.raises(policy.ManifestError):
        render(cluster)


# --- the one list is what the add-ons render ---------------------------------------------


def rendered_namespaces(cluster: Cluster) -> set[str]:
    """Every namespace the cluster's add-ons create (Namespace objects) or put objects in."""
    objects = all_objects(render(cluster))
    created = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    used = {o["metadata"]["namespace"] for o in objects if o["metadata"].get("namespace")}
    return created | used


def test_every_namespace_the_addons_render_is_listed():
    """The examples between them run every add-on (repair and Kueue included); what they render
    outside the teams' namespaces is exactly the list, so a new add-on's namespace cannot be missed."""
    from corral.model import load_cluster

    seen: set[str] = set()
    for name in ("heron", "ibis", "jaguar"):
        cluster = load_cluster(EXAMPLES / f"{name}.yaml")
        teams = {ns for team in cluster.scheduling.teams for ns in team.namespaces}
        seen |= rendered_namespaces(cluster) - teams
    assert seen == set(ADDON_NAMESPACES) | set(KUBERNETES_NAMESPACES)


def test_the_addons_own_constants_are_the_lists():
    """The copies that cannot import the list (the controller's standalone protocol file; Kueue's
    modules) hold the same names."""
    assert repair_protocol.REPAIR_NAMESPACE in ADDON_NAMESPACES
    assert kueue.NAMESPACE in ADDON_NAMESPACES and multikueue_certs.NAMESPACE == kueue.NAMESPACE
    assert set(policy.SYSTEM_NAMESPACES) <= set(ADDON_NAMESPACES) | set(KUBERNETES_NAMESPACES)
    assert set(policy.API_SERVER_ADDON_NAMESPACES) <= set(ADDON_NAMESPACES)
