"""What was promised: the actions a saved plan (``plan --out``) carries, checked against a fresh
plan made under the node lock before anything runs. Pure.

The fresh plan runs only if it has the same actions (kind, target and fields, in order:
``plan/compare.py``); otherwise the run is refused naming the difference, so what was reviewed
is what runs and a file edited after review runs nothing. The file's own actions never run:
whoever can write the file could have put anything in them.
"""

from __future__ import annotations

from reconciler.model import (
    Action,
    ApplyError,
    CrCreate,
    CrDelete,
    CrUpdate,
    DevicePluginRefresh,
    Plan,
    Problem,
    VgpuCreate,
    VgpuRemove,
)
from reconciler.model.errors import excerpt
from reconciler.model.record import record

#: How many differences a refusal lists before "… and N more".
DIFFERENCES_SHOWN = 5


@record(frozen=True, slots=True)
class Expected:
    """The actions a run was promised to carry out, and where the promise came from."""

    actions: tuple[Action, ...]
    #: How messages name the promise (a saved plan's path).
    name: str
    #: The host fingerprint the promise was planned from (a saved plan's); None: not checked.
    fingerprint: str | None = None

    def check(self, fresh: Plan, *, adopt: bool) -> None:
        """Raise :class:`ApplyError` naming the difference unless ``fresh`` (planned under the
        lock, from the host and cluster as they are) does what was promised."""
        from reconciler.plan.compare import compare_actions

        name = self.name
        host_changed = (
            self.fingerprint is not None and self.fingerprint != fresh.observed_fingerprint
        )
        difference = compare_actions(self.actions, fresh.actions)
        if not difference and not host_changed:
            return
        again = "nothing was changed; run 'vgpuctl plan' again"
        if not difference:
            raise ApplyError(
                f"{name} is stale: the host changed since the plan was made (planned from "
                f"{(self.fingerprint or '')[:19]}…, now {fresh.observed_fingerprint[:19]}…); "
                + again
            )
        why = (
            "is stale: the host changed since the plan was made, and a fresh plan of its "
            "desired state differs from it"
            if host_changed
            else "does not match a fresh plan of its desired state: it was edited, or what the "
            "plan depends on besides the host (the cluster, the kubelet's allocations) changed "
            "since it was made"
        )
        lines = [
            *(f"only in {name}: {action_words(a)}" for a in difference.only_saved),
            *(f"only in a fresh plan: {action_words(a)}" for a in difference.only_fresh),
            *(f"{action_words(c.saved)}: {', '.join(c.fields)} differ" for c in difference.changed),
        ]
        if difference.reordered:
            lines.append("the same actions, in another order")
        if len(lines) > DIFFERENCES_SHOWN:
            more = len(lines) - (DIFFERENCES_SHOWN - 1)
            lines = [*lines[: DIFFERENCES_SHOWN - 1], f"… and {more} more differences"]
        if not adopt and any(isinstance(a, CrUpdate) and a.adopt for a in self.actions):
            lines.append("the plan adopts objects another controller manages: pass --adopt")
        header = f"{name} {why}; {again}"
        raise ApplyError(header, [Problem(header), *(Problem(f"  {line}") for line in lines)])


def action_words(action: Action) -> str:
    """``vgpu-remove 0000:08:00.5 (NVIDIA A2-4Q)``: an action of an untrusted file, escaped."""
    match action:
        case VgpuRemove() | VgpuCreate() | DevicePluginRefresh():
            detail: str | None = action.type_name
        case CrCreate() | CrUpdate():
            detail = action.object.kind
        case CrDelete():
            detail = action.object_kind
        case _:
            detail = None
    words = f"{action.kind.value} {excerpt(action.target)}"
    return f"{words} ({excerpt(detail, 40)})" if detail else words
