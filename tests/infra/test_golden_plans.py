"""Golden plans of the example fleet, and what a plan must never contain or depend on.

Each example's plan (resources, outputs, diagnostics; as `corral plan`
makes it, with the real cloud package and the stack's settings) is compared
with tests/golden/plans/<cluster>.json. After an intended change, regenerate
them and review the diff like code:

    CORRAL_UPDATE_GOLDEN=1 pytest tests/infra/test_golden_plans.py
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from corral.model import load_fleet

from .conftest import EXAMPLES, ROOT, edited_cluster, real_plan

GOLDEN = ROOT / "tests" / "golden" / "plans"
UPDATE = os.environ.get("CORRAL_UPDATE_GOLDEN") == "1"
EXAMPLE_NAMES = ("heron", "ibis", "jaguar")


def snapshot_text(plan) -> str:
    return json.dumps(plan.snapshot(), indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_plan_matches_golden(name):
    cluster = load_fleet([EXAMPLES]).clusters[name]
    text = snapshot_text(real_plan(cluster, EXAMPLES))
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"no golden plan {path}; create it with CORRAL_UPDATE_GOLDEN=1"
    expected = path.read_text()
    if text != expected:
        # A readable failure: which resources differ, not a 5,000-line diff.
        got, want = json.loads(text), json.loads(expected)
        key = lambda r: (r["type"], r["name"])  # noqa: E731
        got_r, want_r = {key(r): r for r in got["resources"]}, {key(r): r for r in want["resources"]}
        lines = [f"added: {k}" for k in sorted(got_r.keys() - want_r.keys())]
        lines += [f"removed: {k}" for k in sorted(want_r.keys() - got_r.keys())]
        lines += [f"changed: {k}" for k in sorted(got_r.keys() & want_r.keys()) if got_r[k] != want_r[k]]
        if got["outputs"] != want["outputs"]:
            lines.append("outputs changed")
        if got["diagnostics"] != want["diagnostics"]:
            lines.append("diagnostics changed")
        pytest.fail(
            f"plan of {name} differs from {path.relative_to(ROOT)}:\n  " + "\n  ".join(lines[:40])
            + "\nif intended: CORRAL_UPDATE_GOLDEN=1 pytest tests/infra/test_golden_plans.py"
        )


def test_plans_are_deterministic():
    cluster = load_fleet([EXAMPLES]).clusters["jaguar"]
    assert snapshot_text(real_plan(cluster, EXAMPLES)) == snapshot_text(real_plan(cluster, EXAMPLES))


# --- Node counts live in group sizes and the inventory, never in resources ---------------

JAGUAR_HOSTS = 'hosts: ["gpu-[001:064].sf1.internal"]'
JAGUAR_RACKS = 'racks: ["sf1-r[01:08]"]'   # one entry per hosts entry, 8 hosts per rack
JAGUAR_POOL_MAX = "maxSize: 200"
PIN_EVENTS = {"members: 5 ": "members: 5\n    dedicatedEventsCluster: false "}


def resource_count(tmp_path: Path, name: str, edits: dict[str, str]) -> tuple[int, dict]:
    variant = tmp_path / f"variant-{len(list(tmp_path.iterdir()))}"
    variant.mkdir()
    cluster, folder = edited_cluster(variant, name, edits)
    plan = real_plan(cluster, folder)
    return len(plan.resources), plan


def test_pool_size_and_host_count_do_not_change_the_number_of_resources(tmp_path):
    base, _ = resource_count(tmp_path, "jaguar", {})
    bigger_pool, plan = resource_count(tmp_path, "jaguar", {JAGUAR_POOL_MAX: "maxSize: 900"})
    more_hosts, _ = resource_count(tmp_path, "jaguar", {
        JAGUAR_HOSTS: 'hosts: ["gpu-[001:064].sf1.internal", "gpu-[101:700].sf1.internal"]',
        JAGUAR_RACKS: 'racks: ["sf1-r[01:08]", "sf1-r[11:85]"]'})
    assert base == bigger_pool == more_hosts
    # ... while the sizes themselves did change where they live (the groups' maxima:
    # one scale set per pool zone on Azure, 900 over three zones; Azure's autoscale
    # setting writes its capacities as strings).
    assert any({300, "300"} & set(_leaves(r["inputs"])) for r in plan.resources if "cpu-d64" in r["name"])


def test_thousands_of_nodes_change_only_what_size_implies(tmp_path):
    """7,500 hosts or a 5,000-machine pool: same resources once the etcd layout is pinned
    (1,000+ nodes turn a dedicated events etcd on by default: more machines, by design)."""
    big_network = {"networkCIDR: 10.200.0.0/20": "networkCIDR: 10.200.0.0/16",
                   "podCIDR: 10.128.0.0/14": "podCIDR: 10.128.0.0/11"}
    base, _ = resource_count(tmp_path, "jaguar", {**PIN_EVENTS, **big_network})
    hosts, _ = resource_count(tmp_path, "jaguar", {
        **PIN_EVENTS, **big_network, JAGUAR_HOSTS: 'hosts: ["gpu-[0001:7428].sf1.internal"]',
        f"\n    {JAGUAR_RACKS}": "",  # 8 racks would not divide 7,428 hosts
    })
    pool, _ = resource_count(tmp_path, "jaguar", {**PIN_EVENTS, **big_network, JAGUAR_POOL_MAX: "maxSize: 5000"})
    assert base == hosts == pool


def _leaves(value) -> list:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [] if isinstance(value, bool) else [value]


# --- Secrets never reach the plan ---------------------------------------------------------

PEM_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_no_private_key_token_or_psk_in_plan_json(name, known_secret_mocks):
    """Even with every secret known (as after `pulumi up`), the plan JSON holds none of them."""
    from corral.infra.plan import plan_cluster, read_stack_config, stack_config_file

    from .conftest import KEY_PEM, PSK_PREFIX, RANDOM_RESULTS

    cluster = load_fleet([EXAMPLES]).clusters[name]
    config, secret_keys = read_stack_config(stack_config_file(name, EXAMPLES))
    plan = plan_cluster(cluster, mocks=known_secret_mocks, preview=False, stack_config=config, secret_config_keys=secret_keys)
    text = plan.to_json() + json.dumps(plan.snapshot())
    assert not PEM_PRIVATE_KEY.search(text)
    assert KEY_PEM.splitlines()[1] not in text
    assert RANDOM_RESULTS["bootstrap-token-secret"] not in text
    assert PSK_PREFIX not in text
    assert plan.outputs["bootstrapToken"] == "[secret]"
    assert plan.outputs["caCertHash"].startswith("sha256:")
    # The machines' user data is shown (references only); the secret store's values are masked.
    machines = json.dumps([r["inputs"] for r in plan.resources if r["type"].endswith(
        ("Instance", "VirtualMachine", "VirtualMachineScaleSet", "LaunchTemplate", "InstanceTemplate"))])
    assert "[secret]" not in machines and "[unknown]" not in machines.replace('"[unknown]"', "")
    values = [r["inputs"] for r in plan.resources if r["type"].endswith(("SecretVersion", "keyvault:Secret"))]
    assert len(values) == 7 and all("[secret]" in json.dumps(v) for v in values)


def test_a_leaked_secret_is_masked_anyway(fake, known_secret_mocks):
    """Defence in depth: a secret store that strips secretness off a secret still leaks nothing."""
    import pulumi

    from corral.infra.plan import plan_cluster

    from .conftest import RANDOM_RESULTS

    original = fake.SecretStore

    class LeakySecretStore(original):
        def put(self, key, value):
            if key == "apiserver":
                pulumi.CustomResource("fake:index:Leak", "leak", {"text": pulumi.Output.unsecret(value)},
                                      pulumi.ResourceOptions(parent=self))
            return super().put(key, value)

    fake.SecretStore = LeakySecretStore
    try:
        cluster = load_fleet([EXAMPLES]).clusters["heron"]
        plan = plan_cluster(cluster, platform=fake, mocks=known_secret_mocks, preview=False)
    finally:
        fake.SecretStore = original
    (leak,) = [r for r in plan.resources if r["name"] == "leak"]
    assert leak["inputs"]["text"] == "[secret]"
    assert RANDOM_RESULTS["bootstrap-token-secret"] not in plan.to_json()
