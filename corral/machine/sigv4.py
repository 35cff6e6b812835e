"""AWS Signature Version 4, standard library only: one copy for everything corral signs.

Shipped as a plain file beside the code that imports it where corral is not installed: the
in-cluster cloud client (corral/health/cloud_api.py, in the node approver's and the repair
controller's ConfigMaps: corral/manifests/api_server_host.py) and a cloud pool node's topology
labels at boot (corral/machine/topology_labels.py). The steps are AWS General Reference,
"Signature Version 4 signing process" (canonical request, string to sign, signing key);
tests/health/test_cloud_api.py checks them against AWS's aws-sig-v4-test-suite vectors.
"""

from __future__ import annotations

import hashlib
import hmac
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

_UNRESERVED = "-_.~"   # RFC 3986 unreserved, besides letters and digits (SigV4's UriEncode)


def _uri_encode(text: str, keep_slash: bool = False) -> str:
    return urllib.parse.quote(text, safe=_UNRESERVED + ("/" if keep_slash else ""))


def _canonical_query(query: str) -> str:
    pairs = []
    for part in query.split("&") if query else []:
        key, _, value = part.partition("=")
        pairs.append((_uri_encode(urllib.parse.unquote(key)), _uri_encode(urllib.parse.unquote(value))))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _canonical_headers(headers: Iterable[tuple[str, str]]) -> tuple[str, str]:
    merged: dict[str, list[str]] = {}
    for name, value in headers:
        # Trim, and squeeze runs of spaces to one ("get-header-value-trim").
        merged.setdefault(name.strip().lower(), []).append(" ".join(value.split()))
    names = sorted(merged)
    return "".join(f"{n}:{','.join(merged[n])}\n" for n in names), ";".join(names)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


@dataclass(frozen=True)
class Signed:
    canonical_request: str
    string_to_sign: str
    authorization: str


def sigv4_authorization(method: str, path: str, query: str, headers: Iterable[tuple[str, str]], body: bytes, *,
                        access_key: str, secret_key: str, region: str, service: str, amz_date: str) -> Signed:
    """The Authorization header of a request, by AWS's Signature Version 4: the canonical
    request (method, URI-encoded path, sorted query, lower-cased sorted headers, signed
    header names, SHA-256 of the payload), the string to sign (AWS4-HMAC-SHA256, the date,
    the scope date/region/service/aws4_request, the canonical request's hash) and the
    HMAC chain kSecret -> kDate -> kRegion -> kService -> kSigning. `headers` are the ones
    signed (host and x-amz-date at least)."""
    canonical_headers, signed_headers = _canonical_headers(headers)
    canonical_request = "\n".join([
        method, _uri_encode(path or "/", keep_slash=True), _canonical_query(query), canonical_headers,
        signed_headers, hashlib.sha256(body).hexdigest()])
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join([
        "AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode("utf-8")).hexdigest()])
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), amz_date[:8])
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, string_to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    return Signed(canonical_request, string_to_sign,
                  f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed_headers}, "
                  f"Signature={signature}")
