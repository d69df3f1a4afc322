"""One exception root, subclassed by phase and by retryability.

Third-party exceptions are wrapped at the boundary where they occur; the CLI turns a
:class:`ReconcilerError` into a one-line message and an exit code, never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.model.record import record


def printable(text: str) -> str:
    """``text`` with control characters escaped: a message quoting the user's input (a key with
    a newline or an escape sequence in it) stays one honest line on a terminal."""
    if text.isprintable():
        return text
    return "".join(map(_escaped, text))


#: The most characters of a file's content any message, log line or Event quotes.
EXCERPT_CHARS = 80


def excerpt(content: str, limit: int = EXCERPT_CHARS) -> str:
    """At most ``limit`` characters of ``content``, escaped as :func:`printable` does, and ``…``
    when there was more: what a message may quote of something read from an untrusted file (a
    symlinked secret must not leak into a log or a cluster Event, nor a megabyte into a line)."""
    shown: list[str] = []
    used = 0
    for ch in content[: limit + 1]:
        piece = _escaped(ch)
        if used + len(piece) > limit:
            return "".join(shown) + "…"
        shown.append(piece)
        used += len(piece)
    return "".join(shown)


def _escaped(ch: str) -> str:
    return ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")


@record(frozen=True, slots=True)
class Problem:
    """One located problem: ``file:line:col: message`` when the location is known."""

    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", printable(self.message))
        if self.file is not None:
            object.__setattr__(self, "file", printable(self.file))

    def __str__(self) -> str:
        if self.file is None:
            return self.message
        if self.line is None:
            return f"{self.file}: {self.message}"
        return f"{self.file}:{self.line}:{self.column or 1}: {self.message}"


class ReconcilerError(Exception):
    """Root of every error the engine raises on purpose."""

    #: Whether running again later may succeed without a change of input.
    transient: bool = False

    def __init__(self, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.problems: tuple[Problem, ...] = tuple(problems)

    def lines(self) -> list[str]:
        """What a user should read: each problem on its own line, else the message."""
        return [str(p) for p in self.problems] or [self.message]


class UsageError(ReconcilerError):
    """The command line itself is wrong."""


class ValidationError(ReconcilerError):
    """The desired state is malformed or impossible (offline checks)."""


class ObserveError(ReconcilerError):
    """The host (or cluster) could not be read."""


class PlanError(ReconcilerError):
    """The desired state cannot be reached on the observed host."""


class AbsentError(PlanError):
    """What the desired state wants of a node is not on its host: a GPU it names by address,
    or any GPU for a node group that selects the node (its driver did not load, the node is
    not the one the group meant). Nothing is planned for that node; the host has drifted from
    its desired state (``assert`` exits 2, ``watch`` is not converged), never "matches"."""


class ApplyError(ReconcilerError):
    """An action failed on the host."""


class ForeignControllerError(ReconcilerError):
    """Another controller manages this node's vGPUs (Harvester's pcidevices-controller), or
    may: node-local apply and watch refuse to change the host or the cluster. Not transient:
    the same cluster refuses the same way until the controller is disabled (or the reads that
    would tell are granted)."""


class TransientError(ReconcilerError):
    """Worth retrying with a delay (busy device, timeout, conflict)."""

    transient = True


class LockHeldError(ApplyError):
    """Another apply holds the node lock."""

    transient = True


class ConflictError(TransientError):
    """An optimistic-concurrency write lost a race (resourceVersion)."""


class ClusterError(ReconcilerError):
    """The cluster could not be read or written as needed."""


class AdmissionDeniedError(ClusterError):
    """A validating admission webhook refused a write (e.g. pcidevices': "device … is in use
    with VM …"); its message is quoted as the server gave it."""


class ClusterUnavailableError(ClusterError):
    """The API server did not answer (connection refused, timeout, 5xx)."""

    transient = True


class ForbiddenError(ClusterError):
    """RBAC denied a request; the message names the verb and the resource."""


class ResourceMissingError(ClusterError):
    """A resource type is not served (e.g. the CRDs are not installed)."""


class ExpiredError(ClusterError):
    """410 Gone: a list's continue token or a watch's resourceVersion is older than the server
    keeps (compacted): read the collection again from the start."""
