"""Links resolved by vgpuctl itself, lexically, inside a root it does not trust.

Both trees vgpuctl reads as root hold links someone else may have planted: the sysfs root (a
tree mounted from elsewhere, a simulated host) and a desired-state directory (a ConfigMap's
editors, a repository's committers). Neither is left to the OS to follow: each link along a
path is read and resolved here, and one that leads outside the root is refused before what it
leads to is opened. The caller then opens the result through no link at all, so a link swapped
in meanwhile is refused, not followed. Pure: the caller says how to read a link.
"""

from __future__ import annotations

from collections.abc import Callable


class LeavesRootError(Exception):
    """``link`` (a path below the root) points at ``target``, outside the root."""

    def __init__(self, link: str, target: str) -> None:
        super().__init__(f"{link} -> {target}")
        self.link = link
        self.target = target


class TooManyLinksError(Exception):
    """More links along one path than any real layout has: a loop, or a maze."""


def resolve_beneath(
    rel: str,
    read_link: Callable[[str], str | None],
    *,
    max_links: int,
    absolute: Callable[[str], str | None] = lambda target: None,
) -> str:
    """``rel`` with every link along it resolved inside the root: the path below the root of
    what it names that passes through no link (``""``: the root itself).

    ``read_link(path)``: the target of the link at ``path`` (relative to the root), None when it
    is not a link; it raises what it raises (``FileNotFoundError`` for a missing part).
    ``absolute(target)``: an absolute target as a path below the root, None when it is outside
    (the default: none is inside). Raises :class:`LeavesRootError` for a link leading outside
    (``..`` above the root included), :class:`TooManyLinksError` past ``max_links`` links.
    """
    done: list[str] = []
    pending = rel.split("/")[::-1]
    links = 0
    via = (rel, "")  # the last link followed, for the message
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                raise LeavesRootError(*via)
            done.pop()
            continue
        here = "/".join((*done, part))
        target = read_link(here)
        if target is None:
            done.append(part)
            continue
        links += 1
        if links > max_links:
            raise TooManyLinksError(rel)
        via = (here, target)
        if target.startswith("/"):
            inside = absolute(target)
            if inside is None:
                raise LeavesRootError(here, target)
            done, target = [], inside
        pending.extend(target.split("/")[::-1])
    return "/".join(done)
