"""The in-cluster cloud client (corral/health/cloud_api.py): SigV4 by AWS's own test vectors,
credentials from each cloud's metadata service, find_instance and replace_instance against a
fake HTTPS cloud at the network boundary (tests/health/fake_cloud.py)."""

from __future__ import annotations

import pytest

from corral.health import cloud_api
from corral.health.instances import NodeGroup, match
from tests.health.fake_cloud import (
    ACCESS_KEY,
    BEARER,
    PROJECT,
    RESOURCE_GROUP,
    SECRET_KEY,
    SESSION_TOKEN,
    SUBSCRIPTION,
    FakeCloudApi,
    FakeInstance,
    FakeMetadata,
)

# --- Signature Version 4: AWS's test suite ---------------------------------------------------
#
# The requests (.req) and the Authorization headers AWS gives for them (.authz), from the
# Signature Version 4 Test Suite (AWS General Reference, "Signature Version 4 test suite"; the
# files as kept in bazelbuild/bazel third_party/aws-sig-v4-test-suite/). All of them sign with
# the suite's example key, region us-east-1, service "service", at 20150830T123600Z.
SUITE_KEY = ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
SUITE_VECTORS = {
    "get-vanilla-query-order-key-case": (
        "GET /?Param2=value2&Param1=value1 HTTP/1.1\nHost:example.amazonaws.com\nX-Amz-Date:20150830T123600Z",
        "SignedHeaders=host;x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
    "get-vanilla-query-unreserved": (
        ("GET /?-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz=-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        "abcdefghijklmnopqrstuvwxyz HTTP/1.1\nHost:example.amazonaws.com\nX-Amz-Date:20150830T123600Z"),
        "SignedHeaders=host;x-amz-date, Signature=9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"),
    "get-vanilla-empty-query-key": (
        "GET /?Param1=value1 HTTP/1.1\nHost:example.amazonaws.com\nX-Amz-Date:20150830T123600Z",
        "SignedHeaders=host;x-amz-date, Signature=a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb"),
    "get-header-value-trim": (
        ('GET / HTTP/1.1\nHost:example.amazonaws.com\nMy-Header1: value1\nMy-Header2: "a   b   c"\n'
        "X-Amz-Date:20150830T123600Z"),
        ("SignedHeaders=host;my-header1;my-header2;x-amz-date, "
        "Signature=acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736")),
    "post-x-www-form-urlencoded": (
        ("POST / HTTP/1.1\nContent-Type:application/x-www-form-urlencoded\nHost:example.amazonaws.com\n"
        "X-Amz-Date:20150830T123600Z\n\nParam1=value1"),
        ("SignedHeaders=content-type;host;x-amz-date, "
        "Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a")),
    "post-sts-header-before": (
        ("POST / HTTP/1.1\nHost:example.amazonaws.com\nX-Amz-Date:20150830T123600Z\nX-Amz-Security-Token:"
        "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8Y"
        "UuwthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6f"
        "E8YQcHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQ"
        "wj2ICCR/oLxBA=="),
        ("SignedHeaders=host;x-amz-date;x-amz-security-token, "
        "Signature=85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead")),
}
# The suite's intermediate results for post-x-www-form-urlencoded (.creq and .sts).
FORM_CANONICAL_REQUEST = (
    "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\n"
    "x-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n"
    "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e")
FORM_STRING_TO_SIGN = ("AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
                       "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281")


def sign_suite_request(text: str) -> cloud_api.Signed:
    head, _, body = text.partition("\n\n")
    request_line, *header_lines = head.split("\n")
    method, target, _ = request_line.split(" ", 2) if request_line.endswith("HTTP/1.1") else (None, None, None)
    target = request_line[len(method) + 1:-len(" HTTP/1.1")]
    path, _, query = target.partition("?")
    headers = [tuple(line.split(":", 1)) for line in header_lines]
    return cloud_api.sigv4_authorization(method, path, query, headers, body.encode(), access_key=SUITE_KEY[0],
                                         secret_key=SUITE_KEY[1], region="us-east-1", service="service",
                                         amz_date="20150830T123600Z")


@pytest.mark.parametrize("name", sorted(SUITE_VECTORS))
def test_sigv4_matches_aws_test_suite(name):
    request, authorization = SUITE_VECTORS[name]
    expected = ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, " + authorization)
    assert sign_suite_request(request).authorization == expected


def test_sigv4_intermediate_steps_match_the_suite():
    signed = sign_suite_request(SUITE_VECTORS["post-x-www-form-urlencoded"][0])
    assert signed.canonical_request == FORM_CANONICAL_REQUEST
    assert signed.string_to_sign == FORM_STRING_TO_SIGN


# --- the fake cloud --------------------------------------------------------------------------

AWS_GROUP = NodeGroup(provider="aws", name="heron-gpu-a10g-inference", region="us-west-2", zones=("us-west-2a",))
AWS_OTHER = NodeGroup(provider="aws", name="heron-gpu-h100", region="us-west-2", zones=("us-west-2a",))
GCP_GROUP = NodeGroup(provider="gcp", name="ibis-gpu-a", region="us-central1", zones=("us-central1-a",),
                      project=PROJECT)
AZURE_GROUP = NodeGroup(provider="azure", name="jaguar-cpu-d64-1", region="eastus", zones=("1",),
                        subscription=SUBSCRIPTION, resourceGroup=RESOURCE_GROUP)

INSTANCES = [
    FakeInstance("aws", AWS_GROUP.name, "ip-10-20-3-4.us-west-2.compute.internal", "i-0aaa", "us-west-2a"),
    FakeInstance("aws", AWS_GROUP.name, "ip-10-20-3-5.us-west-2.compute.internal", "i-0bbb", "us-west-2a",
                 state="stopped"),
    FakeInstance("aws", AWS_OTHER.name, "ip-10-20-9-9.us-west-2.compute.internal", "i-0ccc", "us-west-2a"),
    FakeInstance("gcp", GCP_GROUP.name, "ibis-gpu-a-x7k2", "8841", "us-central1-a", state="RUNNING"),
    FakeInstance("gcp", GCP_GROUP.name, "ibis-gpu-a-stop", "8842", "us-central1-a", state="TERMINATED"),
    *[FakeInstance("azure", AZURE_GROUP.name, f"jaguar-cpu-d64-1-00000{n}", str(n), "1",
                   state="PowerState/running") for n in range(5)],
    FakeInstance("azure", AZURE_GROUP.name, "jaguar-cpu-d64-1-0000zz", "9", "1", state="PowerState/deallocated"),
]


@pytest.fixture
def cloud(tmp_path):
    import copy

    with FakeCloudApi(tmp_path, copy.deepcopy(INSTANCES)) as api:
        yield api


def session_for(provider: str, api: FakeCloudApi, metadata: FakeMetadata) -> cloud_api.CloudSession:
    return cloud_api.CloudSession(provider, metadata_url=metadata.url, **api.session_args())


@pytest.mark.parametrize("group, node, instance_id", [
    (AWS_GROUP, "ip-10-20-3-4.us-west-2.compute.internal", "i-0aaa"),
    (AWS_GROUP, "ip-10-20-3-4", "i-0aaa"),                       # the short name: the region's DNS suffix
    (GCP_GROUP, "ibis-gpu-a-x7k2", "ibis-gpu-a-x7k2"),
    (AZURE_GROUP, "jaguar-cpu-d64-1-000004", "4"),               # on the third page of the list
])
def test_a_running_member_is_found(cloud, group, node, instance_id):
    with FakeMetadata(group.provider) as metadata:
        found = cloud_api.find_instance(group, node, session=session_for(group.provider, cloud, metadata))
    assert found is not None and found.running and found.instance_id == instance_id and found.group == group.name


@pytest.mark.parametrize("group, node", [
    (AWS_GROUP, "ip-10-20-9-9.us-west-2.compute.internal"),     # an instance of another pool's ASG
    (AWS_GROUP, "ip-10-99-0-1.us-west-2.compute.internal"),     # no instance at all
    (GCP_GROUP, "ibis-gpu-a-zzzz"),
    (AZURE_GROUP, "jaguar-cpu-d64-2-000001"),
])
def test_a_name_that_is_no_member_is_not_found(cloud, group, node):
    with FakeMetadata(group.provider) as metadata:
        assert cloud_api.find_instance(group, node, session=session_for(group.provider, cloud, metadata)) is None


@pytest.mark.parametrize("group, node, state", [
    (AWS_GROUP, "ip-10-20-3-5.us-west-2.compute.internal", "stopped"),
    (GCP_GROUP, "ibis-gpu-a-stop", "TERMINATED"),
    (AZURE_GROUP, "jaguar-cpu-d64-1-0000zz", "PowerState/deallocated"),
])
def test_a_member_that_is_not_running_says_so(cloud, group, node, state):
    with FakeMetadata(group.provider) as metadata:
        found = cloud_api.find_instance(group, node, session=session_for(group.provider, cloud, metadata))
    assert found is not None and not found.running and found.state == state


@pytest.mark.parametrize("group", [AWS_GROUP, GCP_GROUP, AZURE_GROUP], ids=lambda g: g.provider)
def test_an_api_error_is_a_cloud_api_error_without_credentials(cloud, group):
    cloud.fail = 503
    with FakeMetadata(group.provider) as metadata, pytest.raises(cloud_api.CloudApiError) as raised:
        cloud_api.find_instance(group, "x", session=session_for(group.provider, cloud, metadata))
    message = str(raised.value)
    assert "503" in message
    for secret in (SECRET_KEY, SESSION_TOKEN, BEARER, ACCESS_KEY):
        assert secret not in message


@pytest.mark.parametrize("group", [GCP_GROUP, AZURE_GROUP], ids=lambda g: g.provider)
def test_an_answer_of_the_wrong_shape_is_a_cloud_api_error(cloud, group):
    cloud.malformed = True
    with FakeMetadata(group.provider) as metadata, pytest.raises(cloud_api.CloudApiError, match="unexpected shape"):
        cloud_api.find_instance(group, "x", session=session_for(group.provider, cloud, metadata))


def test_no_metadata_service_is_a_cloud_api_error(cloud):
    session = cloud_api.CloudSession("gcp", metadata_url="http://127.0.0.1:9", **cloud.session_args())
    with pytest.raises(cloud_api.CloudApiError, match="GCE metadata token"):
        cloud_api.find_instance(GCP_GROUP, "ibis-gpu-a-x7k2", session=session)


def test_credentials_come_from_the_metadata_service_once(cloud):
    with FakeMetadata("aws") as metadata:
        session = session_for("aws", cloud, metadata)
        for _ in range(3):
            assert cloud_api.find_instance(AWS_GROUP, "ip-10-20-3-4", session=session) is not None
    # IMDSv2: a token first; the role's credentials once, then reused until they near expiry.
    assert metadata.requests == [("PUT", "/latest/api/token"), ("GET", "/latest/meta-data/iam/security-credentials/"),
                                 ("GET", "/latest/meta-data/iam/security-credentials/jaguar-apiserver")]
    # Every call was signed right (the fake checks the signature and the session token).
    assert cloud.calls == [("aws", "DescribeInstances")] * 3


def test_azure_next_link_to_another_host_is_refused(cloud, monkeypatch):
    with FakeMetadata("azure") as metadata:
        session = session_for("azure", cloud, metadata)
        original = session.bearer

        def redirected(method, url, body, what):
            answer = original(method, url, body, what)
            if "nextLink" in answer:
                answer["nextLink"] = "https://attacker.example/steal"
            return answer

        monkeypatch.setattr(session, "bearer", redirected)
        with pytest.raises(cloud_api.CloudApiError, match="nextLink leaves"):
            cloud_api.find_instance(AZURE_GROUP, "jaguar-cpu-d64-1-000004", session=session)


# --- replace_instance ----------------------------------------------------------------------------

@pytest.mark.parametrize("cloud_name, group, provider_id, operation", [
    ("aws", AWS_GROUP, "aws:///us-west-2a/i-0aaa", "TerminateInstanceInAutoScalingGroup"),
    ("gcp", GCP_GROUP, f"gce://{PROJECT}/us-central1-a/ibis-gpu-a-x7k2", "recreateInstances"),
    ("azure", AZURE_GROUP, (f"azure:///subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/"
                           "Microsoft.Compute/virtualMachineScaleSets/jaguar-cpu-d64-1/virtualMachines/3"), "delete"),
])
def test_replace_instance_makes_the_operator_paths_call(cloud, cloud_name, group, provider_id, operation):
    target = match(cloud_name, "node-1", "pool", provider_id, {"pool": [group]})
    with FakeMetadata(cloud_name) as metadata:
        cloud_api.replace_instance(target, session=session_for(cloud_name, cloud, metadata))
    assert cloud.calls == [(cloud_name, operation)]
    replaced = [i for i in cloud.instances if i.instance_id == target.claim.instance
                or i.node_name == target.claim.instance]
    assert replaced and replaced[0].state in ("shutting-down", "STOPPING", "PowerState/deallocating")


def test_the_session_refuses_another_clouds_group(cloud):
    with FakeMetadata("gcp") as metadata, pytest.raises(cloud_api.CloudApiError, match="is on aws"):
        cloud_api.find_instance(AWS_GROUP, "x", session=session_for("gcp", cloud, metadata))


def test_gcp_and_azure_identity_comes_from_metadata(cloud):
    with FakeMetadata("gcp") as metadata:
        assert session_for("gcp", cloud, metadata).identity() == {"project": PROJECT}
    with FakeMetadata("azure") as metadata:
        assert session_for("azure", cloud, metadata).identity() == {
            "subscription": SUBSCRIPTION, "resource_group": RESOURCE_GROUP}
