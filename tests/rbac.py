"""What deploy/rbac.yaml grants the agent's service account, and whether it allows a request.

Bindings are followed the way the RBAC authorizer does: a ClusterRoleBinding grants its
ClusterRole everywhere; a RoleBinding grants its Role (or a ClusterRole) in its own namespace
only. A rule's ``resourceNames`` grant its verbs on those names alone: a request naming another
object, or none (a list, a create), is not allowed by it. Tests compare the requests recorded by
the API-server emulator with these grants.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from tests.doubles.admission import UserInfo
from tests.doubles.emulator import ApiServerEmulator, Request

RBAC = Path(__file__).resolve().parents[1] / "deploy" / "rbac.yaml"
SERVICE_ACCOUNT = {"kind": "ServiceAccount", "name": "vgpuctl", "namespace": "vgpuctl-system"}
#: Delegate mode's role (docs/delegate.md), and the account it is bound to.
DELEGATE_RBAC = RBAC.parent / "harvester" / "rbac.yaml"
#: The read-only identity examples/gitops/ suggests for CI's `plan --observed cluster`.
CI_RBAC = RBAC.parents[1] / "examples" / "gitops" / "ci-rbac.yaml"
CI_ACCOUNT = {"kind": "ServiceAccount", "name": "vgpuctl-ci", "namespace": "vgpuctl-system"}
DELEGATE_ACCOUNT = {
    "kind": "ServiceAccount",
    "name": "vgpuctl-delegate",
    "namespace": "vgpuctl-delegate",
}


class Grant(NamedTuple):
    group: str
    resource: str  # with "/status" for the subresource
    verb: str
    namespace: str | None  # None: every namespace (and cluster-scoped resources)
    name: str | None = None  # None: any object (no resourceNames); else that object only


def grants(path: Path = RBAC, account: dict[str, str] = SERVICE_ACCOUNT) -> set[Grant]:
    """Everything the bindings in ``path`` give ``account`` (the agent's by default)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    out: set[Grant] = set()
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if account not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role_namespace = where if ref["kind"] == "Role" else None
        role = roles[(ref["kind"], role_namespace, ref["name"])]
        out |= set(_rules(role["rules"], where))
    return out


def _rules(rules: Iterable[dict[str, Any]], namespace: str | None) -> Iterable[Grant]:
    for rule in rules:
        names: list[str | None] = list(rule.get("resourceNames") or [None])
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in names:
                        yield Grant(group, resource, verb, namespace, name)


def needed(request: Request) -> Grant:
    """The grant a recorded request needs (naming the object when the request names one)."""
    resource = request.resource + (f"/{request.subresource}" if request.subresource else "")
    return Grant(request.group, resource, request.verb, request.namespace, request.name)


def allows(granted: set[Grant], request: Request) -> bool:
    want = needed(request)
    return any(
        want._replace(namespace=namespace, name=name) in granted
        for namespace in {want.namespace, None}
        for name in {want.name, None}
    )


def unused(granted: set[Grant], requests: Iterable[Request]) -> set[Grant]:
    """Grants no request in ``requests`` needed."""
    used = {needed(r) for r in requests}
    return {
        g
        for g in granted
        if not any(
            (u.group, u.resource, u.verb) == (g.group, g.resource, g.verb)
            and (g.namespace is None or g.namespace == u.namespace)
            and (g.name is None or g.name == u.name)
            for u in used
        )
    }


class Enforced(NamedTuple):
    """A role enforced on one account's requests (:func:`enforce`)."""

    user: UserInfo
    granted: set[Grant]
    #: Every request the account made, allowed or not.
    requests: list[Request]

    def refused(self) -> list[Request]:
        return [r for r in self.requests if not allows(self.granted, r)]


def enforce(
    emu: ApiServerEmulator, path: Path = RBAC, account: dict[str, str] = SERVICE_ACCOUNT
) -> Enforced:
    """Make the emulator authorise ``account``'s requests by what ``path`` grants it (anyone
    else, the test and its doubles, is allowed everything) and record them."""
    user = UserInfo(f"system:serviceaccount:{account['namespace']}:{account['name']}")
    enforced = Enforced(user, grants(path, account), [])

    def authorize(request: Request, who: UserInfo) -> bool:
        if who != user:
            return True
        enforced.requests.append(request)
        return allows(enforced.granted, request)

    emu.authorize_with(authorize)
    return enforced
