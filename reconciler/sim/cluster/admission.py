"""ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) evaluated as the API server does,
for the emulator: the policies and bindings it stores judge each write of an identified caller.

Modelled on k8s.io/apiserver pkg/admission/plugin/policy/validating (dispatcher.go, the CEL
filter in plugin/cel/filter.go):

- a binding names a policy; the policy applies when the request matches its
  ``matchConstraints.resourceRules`` (group, version, operation, resource or
  ``resource/subresource``, ``*`` wildcards; ``excludeResourceRules``), the binding's
  ``matchResources`` if given, and every ``matchConditions`` expression is true;
- ``variables`` are evaluated in order (an error is kept as the variable's value, so it only
  matters where an expression uses it, as with cel-go's lazy variables), then each
  ``validations`` expression: false denies with its ``message`` (else ``failed expression:
  …``), an error denies under ``failurePolicy: Fail`` (the default) with ``expression '…'
  resulted in error: …``;
- the first denial of a binding whose ``validationActions`` hold ``Deny`` is answered 422
  (reason Invalid unless the validation names one) with the message
  ``<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<p>' with binding '<b>'
  denied request: <message>``;
- CEL sees ``object`` / ``oldObject`` (null for a create / a delete) and ``request`` (the
  AdmissionRequest: ``userInfo.extra`` is omitted when empty, as its JSON tag says) as plain
  JSON values, the way the API server hands them over (unstructured maps, not typed objects).

The CEL is cel-python's (``celpy``): standard CEL, plus ``split`` and ``trim`` of the strings
library the API server adds (k8s.io/apiserver pkg/cel/environment/base.go: cel-go's
``ext.Strings``, version 2 since Kubernetes 1.29; their semantics are cel-go's ext/strings.go:
Go's ``strings.Split``, and trimming Unicode white space as Go's ``unicode.IsSpace`` tells it).
Kubernetes' other CEL libraries (the rest of the strings library, ``authorizer``, quantities,
…) are not available, nor are ``params``, namespace and object
selectors, ``messageExpression``, and the audit and warn actions (a policy using them is
refused here, loudly). Where cel-python differs from cel-go (the API server's CEL):

- values of different types: cel-go compares them as unequal, cel-python raises (``x != null``
  for a map, too: write ``!(x == null)`` or ``x == null ? a : b``);
- ``has()`` of a field of an erroneous value is false in cel-python, an error in cel-go;
- cel-python evaluates both operands of ``&&`` / ``||`` (errors are values, so the result is
  the same), and a macro over null fails outright (an error here, as the expression's result).

A policy that errors where it should not therefore shows as a refusal or, through ``has()``,
as a permissive value: ``variables_of`` lets tests check that no variable fails.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reconciler.model.record import field, record

JsonObject = dict[str, Any]

_REASON_CODES = {
    "Unauthorized": 401,
    "Forbidden": 403,
    "Invalid": 422,
    "RequestEntityTooLarge": 413,
}


@record(frozen=True)
class UserInfo:
    """Who sends a request: what the authenticator found in the bearer token."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def json(self) -> JsonObject:
        """``request.userInfo`` (authentication/v1 UserInfo: empty fields are omitted)."""
        out: JsonObject = {"username": self.username}
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


@record(frozen=True)
class Attributes:
    """One write as admission sees it."""

    operation: str  # CREATE UPDATE DELETE
    group: str
    version: str
    resource: str  # plural
    kind: str
    subresource: str
    namespace: str
    name: str
    user: UserInfo
    object: JsonObject | None
    old_object: JsonObject | None

    @property
    def qualified(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def request(self) -> JsonObject:
        """The AdmissionRequest (admission/v1) CEL's ``request`` holds, with its JSON tags'
        omitempty: ``subResource``, ``name`` and ``namespace`` only when set."""
        out: JsonObject = {
            "uid": "00000000-0000-0000-0000-000000000000",
            "kind": {"group": self.group, "version": self.version, "kind": self.kind},
            "resource": {"group": self.group, "version": self.version, "resource": self.resource},
            "requestKind": {"group": self.group, "version": self.version, "kind": self.kind},
            "requestResource": {
                "group": self.group,
                "version": self.version,
                "resource": self.resource,
            },
            "operation": self.operation,
            "userInfo": self.user.json(),
            "dryRun": False,
        }
        for key, value in (
            ("subResource", self.subresource),
            ("requestSubResource", self.subresource),
            ("name", self.name),
            ("namespace", self.namespace),
        ):
            if value:
                out[key] = value
        return out


@record(frozen=True)
class Denial:
    code: int
    reason: str
    message: str  # the whole Status message
    cause: str  # the policy's part, also the Status' one cause


class PolicyNotSupportedError(Exception):
    """A policy uses a feature this model does not evaluate."""


def admit(
    attributes: Attributes,
    policies: Sequence[Mapping[str, Any]],
    bindings: Sequence[Mapping[str, Any]],
    *,
    namespace_object: JsonObject | None = None,
) -> Denial | None:
    """The denial of the first binding whose policy rejects ``attributes``, or None."""
    by_name = {str(p["metadata"]["name"]): p for p in policies}
    for binding in sorted(bindings, key=lambda b: str(b["metadata"]["name"])):
        spec = binding.get("spec") or {}
        policy = by_name.get(str(spec.get("policyName")))
        if policy is None:
            continue
        actions = spec.get("validationActions") or []
        if set(actions) - {"Deny"}:
            raise PolicyNotSupportedError(f"validationActions {actions} (only Deny is modelled)")
        if spec.get("paramRef") is not None:
            raise PolicyNotSupportedError("paramRef")
        if spec.get("matchResources") and not _matches(spec["matchResources"], attributes):
            continue
        message = _evaluate(policy, attributes, namespace_object)
        if message is None or "Deny" not in actions:
            continue
        text, reason = message
        cause = (
            f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
            f"'{binding['metadata']['name']}' denied request: {text}"
        )
        subject = (
            f'{attributes.qualified} "{attributes.name}"'
            if attributes.name
            else (attributes.qualified)
        )
        return Denial(
            code=_REASON_CODES.get(reason, 422),
            reason=reason,
            message=f"{subject} is forbidden: {cause}",
            cause=cause,
        )
    return None


# -- matching -----------------------------------------------------------------------------------


def _matches(match: Mapping[str, Any], a: Attributes) -> bool:
    for selector in ("namespaceSelector", "objectSelector"):
        if match.get(selector):
            raise PolicyNotSupportedError(selector)
    rules = match.get("resourceRules")
    if rules is not None and not any(_rule_matches(r, a) for r in rules):
        return False
    return not any(_rule_matches(r, a) for r in match.get("excludeResourceRules") or ())


def rule_matches(rule: Mapping[str, Any], a: Attributes) -> bool:
    """Whether a rule (``RuleWithOperations``: apiGroups, apiVersions, operations, resources
    with ``resource/subresource`` and ``*``, scope) matches a request, as the API server's
    ``rules.Matcher`` (k8s.io/apiserver pkg/admission/plugin/webhook/predicates/rules) judges
    it for policies and webhooks alike."""
    return _rule_matches(rule, a)


def _rule_matches(rule: Mapping[str, Any], a: Attributes) -> bool:
    def listed(values: Any, value: str) -> bool:
        return "*" in (values or ()) or value in (values or ())

    if rule.get("resourceNames") and a.name not in rule["resourceNames"]:
        return False
    scope = rule.get("scope", "*")
    if scope != "*" and (scope == "Namespaced") != bool(a.namespace):
        return False
    if not (
        listed(rule.get("apiGroups"), a.group)
        and listed(rule.get("apiVersions"), a.version)
        and listed(rule.get("operations"), a.operation)
    ):
        return False
    for name in rule.get("resources") or ():
        res, _, sub = str(name).partition("/")
        if res not in ("*", a.resource):
            continue
        if (not sub and not a.subresource) or sub == "*" or (sub and sub == a.subresource):
            return True
    return False


# -- CEL ----------------------------------------------------------------------------------------


def _evaluate(
    policy: Mapping[str, Any], a: Attributes, namespace_object: JsonObject | None
) -> tuple[str, str] | None:
    """(message, reason) of the first validation that fails, or None (also when the policy
    does not apply)."""
    spec = policy.get("spec") or {}
    if spec.get("paramKind") is not None:
        raise PolicyNotSupportedError("paramKind")
    if not _matches(spec.get("matchConstraints") or {}, a):
        return None
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    activation = _activation(a, namespace_object)
    for condition in spec.get("matchConditions") or ():
        try:
            matched = _run(str(condition["expression"]), activation)
        except _CelError as e:
            if fail_closed:
                return f"failed to evaluate match condition '{condition['name']}': {e}", "Invalid"
            return None
        if matched is not True:
            return None
    _bind_variables(spec, activation)
    for validation in spec.get("validations") or ():
        expression = str(validation["expression"])
        reason = str(validation.get("reason") or "Invalid")
        try:
            result = _run(expression, activation)
        except _CelError as e:
            if fail_closed:
                return f"expression '{expression}' resulted in error: {e}", reason
            continue
        if result is not True:
            if validation.get("messageExpression"):
                raise PolicyNotSupportedError("messageExpression")
            return str(validation.get("message") or f"failed expression: {expression}"), reason
    return None


def variables_of(
    policy: Mapping[str, Any], a: Attributes, *, namespace_object: JsonObject | None = None
) -> dict[str, Any]:
    """The values of ``policy``'s variables for ``a`` (a :class:`Failed` for one whose
    expression fails), as its validations see them."""
    activation = _activation(a, namespace_object)
    _bind_variables(policy.get("spec") or {}, activation)
    variables: dict[str, Any] = activation["variables"]
    return variables


def _activation(a: Attributes, namespace_object: JsonObject | None) -> dict[str, Any]:
    return {
        "object": copy.deepcopy(a.object),
        "oldObject": copy.deepcopy(a.old_object),
        "request": a.request(),
        "params": None,
        "namespaceObject": copy.deepcopy(namespace_object),
    }


def _bind_variables(spec: Mapping[str, Any], activation: dict[str, Any]) -> None:
    variables: dict[str, Any] = {}
    activation["variables"] = variables
    for variable in spec.get("variables") or ():
        try:
            variables[str(variable["name"])] = _run(str(variable["expression"]), activation)
        except _CelError as e:
            variables[str(variable["name"])] = Failed(str(e))


class _CelError(Exception):
    pass


@record(frozen=True)
class Failed:
    """A variable whose expression failed: using it fails the expression that does."""

    error: str


_PROGRAMS: dict[str, Any] = {}
#: What Go's ``unicode.IsSpace`` calls white space (cel-go's ``trim`` strips it).
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _split(text: Any, separator: Any) -> Any:
    """cel-go ext ``<string>.split(<string>)``: Go's ``strings.Split`` (an empty separator
    splits after each character; an empty text is one empty string)."""
    from celpy import celtypes

    parts = list(str(text)) if str(separator) == "" else str(text).split(str(separator))
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _trim(text: Any) -> Any:
    """cel-go ext ``<string>.trim()``: leading and trailing white space removed."""
    from celpy import celtypes

    return celtypes.StringType(str(text).strip(_GO_SPACE))


_K8S_FUNCTIONS: dict[str, Any] = {"split": _split, "trim": _trim}


def compile_expression(expression: str) -> Any:
    """A cel-python program for ``expression`` (cached); raises on a syntax error."""
    program = _PROGRAMS.get(expression)
    if program is None:
        import celpy

        env = celpy.Environment()
        program = env.program(env.compile(expression), functions=_K8S_FUNCTIONS)
        _PROGRAMS[expression] = program
    return program


def _run(expression: str, activation: Mapping[str, Any]) -> Any:
    """The value of ``expression`` (as plain Python: bool, str, list, dict, None)."""
    import celpy
    from celpy import celtypes

    try:
        program = compile_expression(expression)
    except Exception as e:  # a syntax error is an evaluation error at admission time
        raise _CelError(f"compilation failed: {e}") from None
    cel_activation = {
        name: _to_cel(value, celpy.json_to_cel, celtypes)
        for name, value in activation.items()
        if name != "variables"
    }
    variables = activation.get("variables")
    if isinstance(variables, dict):
        cel_activation["variables"] = celtypes.MapType(
            {
                # A failed variable is its error, as a value: CEL's short-circuit rules
                # decide whether an expression using it fails (cel-go evaluates lazily).
                celtypes.StringType(k): (
                    celpy.CELEvalError(v.error)
                    if isinstance(v, Failed)
                    else _to_cel(v, celpy.json_to_cel, celtypes)
                )
                for k, v in variables.items()
            }
        )
    try:
        value = program.evaluate(cel_activation)
    except celpy.CELEvalError as e:
        raise _CelError(_cel_message(e)) from None
    except Exception as e:  # cel-python's own failure (a macro over null): an error here too
        raise _CelError(f"{type(e).__name__}: {e}") from None
    if isinstance(value, celpy.CELEvalError):
        raise _CelError(_cel_message(value))
    return _from_cel(value, celtypes)


def _cel_message(error: Exception) -> str:
    args = getattr(error, "args", ())
    return str(args[0]) if args else str(error)


def _to_cel(value: Any, json_to_cel: Callable[[Any], Any], celtypes: Any) -> Any:
    if value is None:
        return None
    return json_to_cel(value)


def _from_cel(value: Any, celtypes: Any) -> Any:
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.MapType):
        return {str(k): _from_cel(v, celtypes) for k, v in value.items()}
    if isinstance(value, celtypes.ListType):
        return [_from_cel(v, celtypes) for v in value]
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    return value
