"""`corral diff` explains etcd machine/disk replacements and membership changes with the one-at-a-time procedure."""

from __future__ import annotations

from corral.diff.resources import CREATE, DELETE, REPLACE, classify


def machine(name: str, ami: str = "ami-1", zone: str = "us-east-1a") -> dict:
    return {"type": "aws:ec2/instance:Instance", "name": name, "inputs": {"ami": ami, "availabilityZone": zone}}


def disk(name: str, zone: str = "us-east-1a") -> dict:
    return {"type": "aws:ebs/volume:Volume", "name": name, "inputs": {"availabilityZone": zone, "size": 256},
            "protect": True}


def test_replacing_a_member_machine_or_disk_names_corral_etcd_replace():
    old = [machine("heron-etcd-0"), machine("heron-etcd-1"), disk("heron-etcd-1-data")]
    new = [machine("heron-etcd-0"), machine("heron-etcd-1", zone="us-east-1b"),
           disk("heron-etcd-1-data", zone="us-east-1b")]
    changes = {c.name: c for c in classify(old, new)}
    for name in ("heron-etcd-1", "heron-etcd-1-data"):
        assert changes[name].action == REPLACE
        assert any("`corral etcd replace CLUSTER heron-etcd-1`" in note and "one member at a time" in note
                   for note in changes[name].notes), changes[name].notes
    assert "heron-etcd-0" not in changes


def test_growing_and_shrinking_the_membership_say_one_at_a_time():
    three = [machine(f"heron-etcd-{i}") for i in range(3)]
    five = [machine(f"heron-etcd-{i}") for i in range(5)]
    grown = {c.name: c for c in classify(three, five)}
    assert {n: c.action for n, c in grown.items()} == {"heron-etcd-3": CREATE, "heron-etcd-4": CREATE}
    assert all(any(f"`corral etcd add CLUSTER {name}`" in note and "one member at a time" in note
                   for note in c.notes) for name, c in grown.items()), grown
    shrunk = {c.name: c for c in classify(five, three)}
    assert all(c.action == DELETE and any(f"`corral etcd remove CLUSTER {name}`" in n for n in c.notes)
               for name, c in shrunk.items()), shrunk
    # A brand-new cluster's members are not "membership changes".
    assert all(not c.notes for c in classify([], three))
