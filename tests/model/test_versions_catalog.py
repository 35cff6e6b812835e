"""The version catalog (corral/model/versions.py): one place for every version corral installs.

Its supported rows are complete and pin nothing past its end of life at a pinned
"today"; support_problem refuses a minor past its end of life and warns before
it, from the catalog and a clock the caller passes; no consolidated module
writes a version literal of its own; and clusters on 1.35, 1.36 and 1.37
validate and render.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from datetime import date
from pathlib import Path

import pytest

from corral.model import load_cluster, versions
from corral.model.containerd import containerd_error, package_version, pause_image
from corral.model.versions import (
    CONTAINERD_LINES,
    DRIVER_BRANCHES,
    MINORS,
    ROW_COMPONENTS,
    SHARED,
    SUPPORTED_MINORS,
    ContainerdSupport,
    Pin,
    release_problem,
    support_problem,
)

from .helpers import example, problems

ROOT = Path(__file__).resolve().parents[2]
# The day the catalog's facts were read: every supported pin must be in support on it.
TODAY = date(2026, 12, 7)


# --- The rows -----------------------------------------------------------------------------------


def test_supported_minors_are_the_three_in_upstream_support():
    assert SUPPORTED_MINORS == ("1.35", "1.36", "1.37")
    assert [versions.minor_of(m) for m in versions.known_minors()][-3:] == list(SUPPORTED_MINORS)
    assert {m: (MINORS[m].released, MINORS[m].end_of_life) for m in SUPPORTED_MINORS} == {
        "1.35": (date(2025, 12, 17), date(2027, 2, 28)),
        "1.36": (date(2026, 4, 22), date(2027, 6, 28)),
        "1.37": (date(2026, 8, 26), date(2027, 10, 28)),
    }
    # The old rows stay, with their end of life, for the clusters that still run them.
    assert {m: MINORS[m].end_of_life for m in ("1.30", "1.31", "1.32", "1.33", "1.34")} == {
        "1.30": date(2025, 6, 28), "1.31": date(2025, 10, 28), "1.32": date(2026, 2, 28),
        "1.33": date(2026, 6, 28), "1.34": date(2026, 10, 27),
    }


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
def test_a_supported_row_has_every_component_each_with_its_source(minor):
    row = MINORS[minor]
    for component in ROW_COMPONENTS:
        pin = getattr(row, component)
        assert pin is not None, f"{minor}: no {component}"
        assert pin.source.strip(), f"{minor}: {component} has no source"
        if isinstance(pin, Pin) and pin.value is None:
            assert pin.missing.strip(), f"{minor}: {component} has no value and no reason"
    assert row.latest_patch is not None and row.released is not None


def test_the_supported_rows_values():
    table = {m: {c: getattr(MINORS[m], c).value for c in ("kubeadm_api", "pause", "etcd", "coredns",
                                                           "containerd_default", "driver_branch")}
             for m in SUPPORTED_MINORS}
    assert table == {
        "1.35": {"kubeadm_api": "v1beta4", "pause": "3.10.1", "etcd": "3.6.6-0", "coredns": "v1.13.1",
                 "containerd_default": "2.3.6", "driver_branch": "R580"},
        "1.36": {"kubeadm_api": "v1beta4", "pause": "3.10.2", "etcd": "3.6.8-0", "coredns": "v1.14.2",
                 "containerd_default": "2.3.6", "driver_branch": "R580"},
        "1.37": {"kubeadm_api": "v1beta4", "pause": "3.10.2", "etcd": "3.7.0-0", "coredns": "v1.14.6",
                 "containerd_default": "2.3.6", "driver_branch": "R580"},
    }
    assert {m: MINORS[m].containerd.minimums for m in SUPPORTED_MINORS} == {
        "1.35": {"2.2": "2.2.0", "2.1": "2.1.5", "1.7": "1.7.28"},
        "1.36": {"2.3": "2.3.0", "2.2": "2.2.0"},
        "1.37": {"2.4": "2.4.0", "2.3": "2.3.0"},
    }
    tags = {m: {c: (p.value or "").rsplit(":", 1)[-1] or None
                for c in ("cluster_autoscaler", "kube_state_metrics", "scheduler_plugins")
                for p in [getattr(MINORS[m], c)]} for m in SUPPORTED_MINORS}
    assert tags == {
        "1.35": {"cluster_autoscaler": "v1.35.2", "kube_state_metrics": "v2.19.1", "scheduler_plugins": None},
        "1.36": {"cluster_autoscaler": "v1.36.1", "kube_state_metrics": "v2.20.0", "scheduler_plugins": None},
        "1.37": {"cluster_autoscaler": None, "kube_state_metrics": "v2.20.0", "scheduler_plugins": None},
    }
    assert MINORS["1.37"].cluster_autoscaler.missing == (
        "no cluster-autoscaler release for 1.37 confirmed (kubernetes/autoscaler tags)")


def test_every_pin_of_every_row_and_every_shared_component_names_its_source():
    for minor, row in MINORS.items():
        assert row.dates_source and row.patches_source, minor
        for component in ROW_COMPONENTS:
            pin = getattr(row, component)
            if isinstance(pin, ContainerdSupport):
                assert pin.source and (pin.why if pin.corral_adds else True), (minor, component)
            elif pin is not None:
                assert pin.source, (minor, component)
    for name, pin in SHARED.items():
        assert pin.value and pin.source, name
    for line in (*CONTAINERD_LINES.values(), *DRIVER_BRANCHES.values()):
        assert line.source, line.name
    with pytest.raises(ValueError, match="no source"):
        Pin("1.0", "")
    with pytest.raises(ValueError, match="must say why"):
        Pin(None, "somewhere")


# --- Nothing pinned past its end of life ----------------------------------------------------------


def expired_pins(minor: str, today: date) -> list[str]:
    """What the row pins whose line has reached its end of life on `today`, or ends before the minor does."""
    row = MINORS[minor]
    found = []
    if row.end_of_life < today:
        found.append(f"Kubernetes {minor} ended {row.end_of_life}")
    containerd_line = CONTAINERD_LINES.get(versions.minor_of(row.containerd_default.value))
    driver_branch = DRIVER_BRANCHES.get(row.driver_branch.value)
    for what, line in (("containerd " + row.containerd_default.value, containerd_line),
                       ("driver branch " + row.driver_branch.value, driver_branch)):
        if line is None:
            found.append(f"{what}: no end of life known")
        elif line.end_of_life < today:
            found.append(f"{what} ended {line.end_of_life}")
        elif line.end_of_life < row.end_of_life:
            found.append(f"{what} ends {line.end_of_life}, before Kubernetes {minor} ({row.end_of_life})")
    return found


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
def test_no_supported_row_pins_a_line_past_its_end_of_life(minor):
    assert expired_pins(minor, TODAY) == []


def test_the_end_of_life_check_bites(monkeypatch):
    # A check that cannot fail proves nothing: R535 (EOL 2026-06), containerd 2.2 (EOL 2026-11-06).
    monkeypatch.setitem(MINORS, "1.35", replace(MINORS["1.35"], driver_branch=Pin("R535", "test"),
                                                 containerd_default=Pin("2.2.4", "test")))
    assert expired_pins("1.35", TODAY) == ["containerd 2.2.4 ended 2026-11-06", "driver branch R535 ended 2026-06-30"]
    # R595 (a production branch, EOL 2027-03) is in support today but ends before 1.37 does.
    monkeypatch.setitem(MINORS, "1.37", replace(MINORS["1.37"], driver_branch=Pin("R595", "test")))
    assert expired_pins("1.37", TODAY) == ["driver branch R595 ends 2027-03-31, before Kubernetes 1.37 (2027-10-28)"]


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
def test_the_default_containerd_fits_its_minor_and_has_a_package(minor):
    default = MINORS[minor].containerd_default.value
    assert containerd_error(f"{minor}.0", default) is None
    assert package_version(default) == f"{default}-1~debian.12~bookworm"


def test_containerd_2_3_on_1_35_is_corrals_addition_with_its_reason():
    support = MINORS["1.35"].containerd
    assert "2.3" not in support.minimums and support.corral_adds == {"2.3": "2.3.0"}
    assert "past its end of life" in support.why and "2.2: 2026-11-06" in support.why
    assert "corral also takes 2.3.0+" in containerd_error("1.35.2", "1.7.27")


def test_the_rows_containerd_lines_and_driver_branches_are_known():
    for minor in SUPPORTED_MINORS:
        assert set(MINORS[minor].containerd.accepted()) <= set(CONTAINERD_LINES), minor
    assert {b: (d.end_of_life.year, d.end_of_life.month) for b, d in DRIVER_BRANCHES.items()
            if b in ("R535", "R580", "R595")} == {"R535": (2026, 6), "R580": (2028, 6), "R595": (2027, 3)}


def test_corrals_etcd_is_at_least_kubeadms_minimum_for_external_etcd():
    # kubeadm's preflight refuses an external etcd below MinExternalEtcdVersion; the kube tier runs
    # this etcd with corral's member configuration (tests/kube/test_control_plane.py).
    from corral.machine.etcd_member import ETCD_VERSION

    for minor in SUPPORTED_MINORS:
        assert versions.key(ETCD_VERSION) >= versions.key(MINORS[minor].min_external_etcd.value), minor


# --- End of life: refused with the upgrade, warned before ---------------------------------------


def test_a_minor_past_its_end_of_life_is_refused_with_the_date_and_the_upgrade():
    problem = support_problem("1.31.4", TODAY, "jaguar")
    assert problem.refused
    assert problem.message == (
        "Kubernetes 1.31 reached its end of life on 2025-10-28; upgrade to 1.35 or later: corral upgrade jaguar "
        "--to 1.32.x, then to 1.33.x, 1.34.x, 1.35.x (one minor at a time: kubeadm skips none)")
    assert support_problem("1.34.8", TODAY, "heron").message == (
        "Kubernetes 1.34 reached its end of life on 2026-10-27; upgrade to 1.35 or later: corral upgrade heron "
        "--to 1.35.x (one minor at a time: kubeadm skips none)")
    assert support_problem("1.30.8", TODAY).message.startswith("Kubernetes 1.30 reached its end of life on 2025-06-28")


@pytest.mark.parametrize(("today", "expected"), [
    (date(2026, 12, 7), None),                     # 83 days left
    (date(2026, 12, 29), None),                    # 61 days
    (date(2026, 12, 30), (False, "in 60 days")),   # the warning starts 60 days before
    (date(2027, 2, 28), (False, "in 0 days")),     # the last day of support
    (date(2027, 3, 1), (True, "upgrade to 1.36 or later: corral upgrade <cluster> --to 1.36.x")),
])
def test_the_clock_decides(today, expected):
    problem = support_problem("1.35.9", today)
    if expected is None:
        assert problem is None
    else:
        refused, text = expected
        assert problem.refused is refused and text in problem.message, problem
    if expected and not expected[0]:
        assert problem.message.startswith("Kubernetes 1.35 reaches its end of life on 2027-02-28")
        assert problem.message.endswith("plan the upgrade to 1.36: corral upgrade <cluster> --to 1.36.x")


def test_every_supported_minor_is_in_support_today_and_unknown_minors_are_refused():
    assert all(support_problem(f"{m}.0", TODAY) is None for m in SUPPORTED_MINORS)
    assert support_problem("1.40.1", TODAY).message.startswith("corral knows Kubernetes 1.26, ")
    assert "so has every minor corral knows" in support_problem("1.37.2", date(2028, 1, 1)).message


def test_patch_releases():
    assert release_problem("1.31.44") == (
        "1.31.44 is not a Kubernetes release: 1.31 ended with 1.31.14 "
        "(kubernetes/website data/releases/eol.yaml (endOfLifeDate, finalPatchRelease))")
    assert release_problem("1.31.14") is None and release_problem("1.30.8") is None
    # A supported minor's newest patch is the newest corral has seen, not the last: newer ones may exist.
    assert {m: MINORS[m].latest_patch for m in SUPPORTED_MINORS} == {"1.35": 9, "1.36": 4, "1.37": 2}
    assert release_problem("1.35.44") is None


# --- No version literal outside the catalog -------------------------------------------------------

# The modules whose versions moved into the catalog: none may write a version of its own.
CONSOLIDATED = ("corral/model/containerd.py", "corral/model/rules.py", "corral/manifests/versions.py",
                "corral/upgrade/versions.py", "corral/machine/kubeadm.py", "corral/machine/scheduler.py")
# A version (1.7.27, v0.17.4, 3.6.6-0, 1.31), an image tag (:v1.2), a kubeadm API version, a
# driver branch: never a part of an IP address or a CIDR (10.96.0.0/16).
VERSION_LITERAL = re.compile(
    r"(?<![\w.])v?\d+\.\d+(?:\.\d+)?(?:-\d+)?(?![\w/]|\.\d)"
    r"|:v?\d+\.\d+|\bv1(?:alpha|beta)\d\b|\bR\d{3}\b|pause:\d"
)


def version_literals(path: Path) -> list[str]:
    """Version-like text in the string literals of a module (docstrings and comments aside)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [f"{shown}:{node.lineno}: {m.group()!r}" for m in VERSION_LITERAL.finditer(node.value)]
        elif (isinstance(node, ast.Tuple) and len(node.elts) == 2
              and all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts)
              and node.elts[0].value == 1):
            found.append(f"{shown}:{node.lineno}: a (1, minor) version tuple")
    return found


@pytest.mark.parametrize("module", CONSOLIDATED)
def test_no_version_literal_outside_the_catalog(module):
    assert version_literals(ROOT / module) == []


def test_the_literal_check_finds_what_the_modules_used_to_hold(tmp_path):
    old = tmp_path / "old.py"
    old.write_text('"""Docstring 1.31.4 is fine."""\n# comment 1.7.27 is fine\n'
                   'PAUSE = {"1.30": "3.9"}\nIMAGE = "registry.k8s.io/kueue/kueue:v0.12.10"\n'
                   'API = "v1beta3"\nDEFAULT = "1.7.27"\nNEW = (major, minor) >= (1, 31)\nBRANCH = "R580"\n'
                   'NET = "10.96.0.0/16"\nPKG = f"{v}-1.1"\n')
    found = [line.split(": ", 1)[1] for line in version_literals(old)]
    assert sorted(found) == sorted(["'1.30'", "'3.9'", "':v0.12'", "'v1beta3'", "'1.7.27'",
                                    "a (1, minor) version tuple", "'R580'", "'1.1'"])


# --- Clusters on the supported minors ------------------------------------------------------------


def on(name: str, version: str) -> str:
    text = re.sub(r'version: "1\.\d+\.\d+"', f'version: "{version}"', example(name), count=1)
    assert f'version: "{version}"' in text
    return text


def onprem_only(text: str) -> str:
    """jaguar without its one cloud pool (cpu-d64, the last pool)."""
    return text[:text.index("  - name: cpu-d64")].rstrip() + "\n"


@pytest.mark.parametrize("version", ["1.35.9", "1.36.4"])
def test_cloud_clusters_on_1_35_and_1_36_validate(tmp_path, version):
    assert problems(tmp_path, {"heron.yaml": on("heron", version), "ibis.yaml": on("ibis", version)}) == []
    cluster = load_cluster(tmp_path / "fleet" / "heron.yaml")
    assert cluster.kubernetes.containerd == "2.3.6"
    assert cluster.kubernetes.containerd_package_version == "2.3.6-1~debian.12~bookworm"
    assert pause_image(version) == f"registry.k8s.io/pause:{MINORS[versions.minor_of(version)].pause.value}"


def test_an_on_prem_cluster_on_1_37_validates(tmp_path):
    text = onprem_only(on("jaguar", "1.37.2"))
    assert problems(tmp_path, {"jaguar.yaml": text}) == []


def test_coscheduling_on_1_35_and_later_is_refused_at_its_line_pointing_to_kueue(tmp_path):
    text = onprem_only(on("jaguar", "1.35.2")).replace("  binPacking: true\n", "  binPacking: true\n  coscheduling: true\n")
    (found,) = problems(tmp_path, {"jaguar.yaml": text})
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "coscheduling: true" in t)
    assert found.startswith(f"jaguar.yaml:{line}:3: scheduling.coscheduling: Coscheduling runs scheduler-plugins' ")
    assert "no release for Kubernetes 1.35 or later" in found and "v0.34.7" in found
    assert "Kueue" in found and "waitForPodsReady" in found and "all or nothing" in found


def test_cloud_pools_on_1_37_are_refused_for_want_of_a_cluster_autoscaler(tmp_path):
    (found,) = problems(tmp_path, {"heron.yaml": on("heron", "1.37.2")})
    assert found.startswith("heron.yaml:7:14: kubernetes.version: cloud pools (cpu-m7i, ")
    assert "no cluster-autoscaler release for 1.37 confirmed (kubernetes/autoscaler tags)" in found
    assert found.endswith("run the newest minor that has one (1.36) until it is released")


def test_the_cluster_autoscaler_renderer_gives_the_same_reason():
    from corral.manifests import versions as images

    with pytest.raises(images.NoPinnedVersion, match=r"no cluster-autoscaler image for Kubernetes 1\.37: no "
                       r"cluster-autoscaler release for 1\.37 confirmed \(kubernetes/autoscaler tags\)"):
        images.cluster_autoscaler("1.37")
    assert images.cluster_autoscaler("1.36").endswith(":v1.36.1")
    assert images.kube_state_metrics("1.37").endswith(":v2.20.0")


def test_an_on_prem_cluster_on_1_37_renders_its_manifests(tmp_path):
    from corral.manifests import render

    (tmp_path / "jaguar.yaml").write_text(onprem_only(on("jaguar", "1.37.2")))
    addons = {a.name: a for a in render(load_cluster(tmp_path / "jaguar.yaml"))}
    assert "cluster-autoscaler" not in addons
    images = {c["image"] for a in addons.values() for o in a.objects if o.get("kind") == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert "registry.k8s.io/kube-state-metrics/kube-state-metrics:v2.20.0" in images
