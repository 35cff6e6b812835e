"""An evaluator of AWS IAM policy documents, for the tests: is a request allowed?

Enough of AWS's evaluation logic to answer "may this principal of the
account do this to the snapshot bucket or its key", from the documents the
components register (never by matching their text):

- a statement applies when its Action, Resource, Principal (resource
  policies) and every condition match; an explicit Deny in any policy wins;
- conditions: StringEquals/StringNotEquals/StringLike, ArnEquals/ArnNotEquals/
  ArnLike, Bool, Null. A key missing from the request makes a condition false,
  except the negated operators (true) and Null ("IAM JSON policy elements:
  Condition operators", AWS IAM User Guide); operators in one statement and
  values of one key combine as AWS says (all operators, any value);
- S3 in one account: allowed when the identity policy or the bucket policy
  allows and neither denies;
- KMS: the key policy must allow, naming the principal, or naming the
  account root (`arn:aws:iam::<account>:root`), which delegates to IAM: then
  the principal's identity policy must allow too ("Key policies in AWS KMS",
  AWS KMS Developer Guide).

Not modelled: SCPs, permission boundaries, session policies, cross-account
access, multi-valued keys (ForAnyValue/ForAllValues) and policy variables.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Request:
    """One API call: who (`principal`, an IAM user/role ARN), what, on what, with what context keys."""

    principal: str
    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)

    def keys(self) -> dict[str, str]:
        """The request context: AWS adds the caller's ARN to every signed request (a role's
        sessions carry the role's ARN in aws:PrincipalArn)."""
        return {"aws:PrincipalArn": self.principal, **self.context}


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _like(pattern: str, value: str, case: bool = True) -> bool:
    if not case:
        pattern, value = pattern.lower(), value.lower()
    return fnmatch.fnmatchcase(value, pattern)


def _condition(operator: str, key: str, wanted: Any, context: dict[str, str]) -> bool:
    values = [str(v).lower() if isinstance(v, bool) else str(v) for v in _listed(wanted)]
    present = key in context
    if operator == "Null":
        # "true": the key must be absent; "false": present.
        return all((not present) == (v.lower() == "true") for v in values)
    negated = "Not" in operator
    if not present:
        return negated
    actual = context[key]
    if operator in ("StringEquals", "ArnEquals"):
        return actual in values
    if operator in ("StringNotEquals", "ArnNotEquals"):
        return actual not in values
    if operator in ("StringLike", "ArnLike"):
        return any(_like(v, actual) for v in values)
    if operator in ("StringNotLike", "ArnNotLike"):
        return not any(_like(v, actual) for v in values)
    if operator == "Bool":
        return actual.lower() in [v.lower() for v in values]
    raise AssertionError(f"condition operator {operator} is not modelled here")


def _conditions_hold(statement: dict, context: dict[str, str]) -> bool:
    return all(
        _condition(operator, key, wanted, context)
        for operator, keys in statement.get("Condition", {}).items()
        for key, wanted in keys.items()
    )


def _principal_matches(statement: dict, principal: str) -> tuple[bool, bool]:
    """(matches, through the account root: delegated to IAM)."""
    named = statement.get("Principal")
    if named == "*" or (isinstance(named, dict) and "*" in _listed(named.get("AWS", []))):
        return True, False
    arns = _listed(named.get("AWS", [])) if isinstance(named, dict) else []
    if principal in arns:
        return True, False
    account = principal.split(":")[4]
    if any(a.endswith(f":{account}:root") for a in arns):
        return True, True
    return False, False


def _applies(statement: dict, request: Request, resource_policy: bool) -> tuple[bool, bool]:
    """Whether `statement` applies to `request`, and whether only through the account root."""
    if not any(_like(a, request.action, case=False) for a in _listed(statement.get("Action", []))):
        return False, False
    if not any(_like(r, request.resource) for r in _listed(statement.get("Resource", "*"))):
        return False, False
    via_root = False
    if resource_policy:
        matches, via_root = _principal_matches(statement, request.principal)
        if not matches:
            return False, False
    return _conditions_hold(statement, request.keys()), via_root


def effects(policy: dict | None, request: Request, resource_policy: bool = False) -> set[str]:
    """The effects of the statements that apply: "Allow", "Deny", "AllowViaRoot"."""
    found: set[str] = set()
    for statement in (policy or {}).get("Statement", []):
        applies, via_root = _applies(statement, request, resource_policy)
        if applies:
            found.add("AllowViaRoot" if statement["Effect"] == "Allow" and via_root else statement["Effect"])
    return found


def s3_allowed(request: Request, identity: dict | None, bucket: dict | None) -> bool:
    """Same-account S3: an allow from either policy, no deny in both (a bucket policy's
    allow to the account root needs the identity policy's allow too)."""
    mine, theirs = effects(identity, request), effects(bucket, request, resource_policy=True)
    if "Deny" in mine | theirs:
        return False
    return "Allow" in mine or "Allow" in theirs


def kms_allowed(request: Request, identity: dict | None, key: dict) -> bool:
    """KMS: the key policy decides; its account-root statements need the identity policy's allow too."""
    mine, theirs = effects(identity, request), effects(key, request, resource_policy=True)
    if "Deny" in mine | theirs:
        return False
    return "Allow" in theirs or ("AllowViaRoot" in theirs and "Allow" in mine)
