"""ValidatingAdmissionPolicies evaluated as the API server evaluates them, for the tests.

corral's policies (pod placement, RDMA traffic class, the GPU health agent's
and the node runner's Node updates) are CEL; cel-python evaluates the same
expressions here: matchConditions, then the variables in order, then every
validation, with its message (or messageExpression) when it fails.
"""

from __future__ import annotations

from typing import Any

import pytest


def evaluate_policy(spec: dict, **activation: Any) -> tuple[bool, list[str]]:
    """(allowed, denial messages) of a ValidatingAdmissionPolicy's `spec` for the request
    whose `object`, `oldObject` and `request` are given as plain data. A request the
    matchConditions leave out is allowed."""
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    context = {name: celpy.json_to_cel(value) for name, value in activation.items()}
    context["variables"] = celpy.json_to_cel({})

    def evaluate(expression: str):
        return env.program(env.compile(expression)).evaluate(context)

    if not all(evaluate(condition["expression"]) for condition in spec.get("matchConditions", [])):
        return True, []
    variables = {}
    for variable in spec.get("variables", []):
        variables[variable["name"]] = evaluate(variable["expression"])
        context["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()})
    messages = []
    for validation in spec["validations"]:
        result = evaluate(validation["expression"])
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            messages.append(str(evaluate(validation["messageExpression"])) if "messageExpression" in validation
                            else validation["message"])
    return not messages, messages
