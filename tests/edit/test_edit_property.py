"""Property: any pool either is refused by the model or round-trips exactly."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.model import ValidationFailed
from corral.model.edit import (
    EditError,
    add_pool,
    pool_data,
    pool_document,
    remove_pool,
    validate_edit,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"
CLUSTERS = {"jaguar": "azure", "heron": "aws", "ibis": "gcp"}
ZONES = {"jaguar": ["1", "2", "3"], "heron": ["us-west-2a", "us-west-2b", "us-west-2c"],
         "ibis": ["us-central1-a", "us-central1-b", "us-central1-c"]}
MACHINES = {"azure": ["Standard_D16s_v5", "Standard_NC24ads_A100_v4", "bad type"],
            "aws": ["m7i.8xlarge", "g6.12xlarge", "Standard_D4"], "gcp": ["n2-standard-32", "g2-standard-48", "m7i.large"]}

names = st.from_regex(r"[a-z][a-z0-9-]{0,12}[a-z0-9]", fullmatch=True)
label_keys = st.sampled_from(["corral.dev/tier", "team", "example.com/x", "Bad Key", "a/b/c"])
label_values = st.sampled_from(["batch", "true", "1.30", "", "yes", "x y", "on", "null", "550.54"])
taints = st.sampled_from(["a=b:NoSchedule", "corral.dev/spot=true:NoExecute", "key:PreferNoSchedule",
                          "bad", "x=y:Sometimes"])


@st.composite
def pools(draw):
    cluster = draw(st.sampled_from(sorted(CLUSTERS)))
    onprem = cluster == "jaguar" and draw(st.booleans())
    gpu = draw(st.none() | st.fixed_dictionaries({
        "model": st.sampled_from(["H100", "L4", "A10G", "b200 x"]),
        "count": st.integers(0, 17),
        "driver": st.none() | st.sampled_from(["550.127.05", "535.54", "570", "1.2.3"]),
    }))
    labels = draw(st.none() | st.dictionaries(label_keys, label_values, max_size=3))
    taint_list = draw(st.none() | st.lists(taints, max_size=2))
    if onprem:
        start = draw(st.integers(1, 300))
        fields = dict(site=draw(st.sampled_from(["sf1", "nyc"])),
                      hosts=[f"gpu-[{start:03d}:{start + draw(st.integers(0, 20)):03d}].sf1.internal"],
                      roce=draw(st.none() | st.fixed_dictionaries({"interfaces": st.just(["ens1f0np0"]),
                                                                    "mtu": st.integers(1000, 9300)})))
        provider = "onprem"
    else:
        provider = CLUSTERS[cluster]
        fields = dict(machine_type=draw(st.sampled_from(MACHINES[provider])),
                      zones=draw(st.none() | st.lists(st.sampled_from(ZONES[cluster]), min_size=1, max_size=3, unique=True)),
                      min_size=draw(st.none() | st.integers(0, 5)), max_size=draw(st.none() | st.integers(0, 50)),
                      spot=draw(st.none() | st.booleans()))
    pool = pool_document(provider, draw(names), gpu=gpu, labels=labels, taints=taint_list, **fields)
    return cluster, pool


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pools())
def test_refused_or_round_trips(fleet_dir, case):
    cluster, pool = case
    original = (EXAMPLES / f"{cluster}.yaml").read_text()
    try:
        new = add_pool(original, pool)
    except EditError as error:
        assert "already exists" in str(error)
        return
    # Whatever the values, the text holds exactly the pool asked for.
    assert pool_data(new, pool["name"]) == pool
    assert remove_pool(new, pool["name"]) == original
    try:
        validate_edit(fleet_dir / f"{cluster}.yaml", new)
    except ValidationFailed as failed:
        assert failed.problems and all(p.file.endswith("(after the edit)") or p.file.endswith(".yaml") for p in failed.problems)
