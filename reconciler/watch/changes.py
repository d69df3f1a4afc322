"""The watch loop's change sources: what says a reconcile may have something new to do.

Each has one job, and none decides when to act (the scheduler does):

- :class:`DesiredFiles`: the desired state in force. Read again when the files' content
  fingerprint changed; an invalid one is reported (log lines with ``file:line:col``,
  ``vgpuctl_desired_state_valid`` 0, a Warning Event on the node's SRIOVGPUDevice objects when a
  cluster is configured) and the last valid one stays in force.
- :class:`HostDrift`: the host signature (``signature.py``: a few reads) against a baseline;
  only a difference costs a full observation.
- :class:`ClusterDrift`: likewise the resourceVersions of our cluster objects (three list
  calls); a cluster that does not answer is logged once, not taken for a change.

A baseline is a fingerprint taken just *before* an observation: whatever changes after it shows
at the next rescan. The reconcile runner (``reconcile.py``) adopts as baselines the last
fingerprints a reconcile took, when it succeeded, and when it failed permanently (then a change
of the host or the cluster is what may make the next try succeed).
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

from reconciler.apply import EventSink
from reconciler.apply.cluster import EVENT_MESSAGE_MAX
from reconciler.catalog import Catalog
from reconciler.model import DesiredNode, Problem, ReconcilerError, UsageError, ValidationError
from reconciler.model.cluster import SRIOV_GPU_KIND, object_name
from reconciler.watch.metrics import WatchMetrics
from reconciler.watch.source import DesiredSource

log = logging.getLogger("vgpuctl.watch")

T = TypeVar("T")


class DesiredChange(enum.Enum):
    """What :meth:`DesiredFiles.check` found."""

    #: The content did not change, or it changed into something invalid (reported).
    NONE = "none"
    #: The first valid desired state.
    FIRST = "first"
    #: A new valid desired state replaces the one in force.
    CHANGED = "changed"
    #: The files changed while they were read (a writer is not done): read them again once
    #: they have been quiet.
    UNSETTLED = "unsettled"


class DesiredFiles(Generic[T]):
    """The desired state in force, from a :class:`DesiredSource`: one node's
    (:meth:`for_node`, the node agent) or every node's (delegate mode's watch)."""

    def __init__(
        self,
        source: DesiredSource,
        *,
        load: Callable[[DesiredSource], T],
        metrics: WatchMetrics,
        events: Callable[[], EventSink | None] = lambda: None,
        event_targets: Callable[[T], Sequence[tuple[str, str]]] = lambda _: (),
        refresh_watches: Callable[[], None] | None = None,
        inputs: Callable[[], str] = lambda: "",
        loaded_inputs: Callable[[], str] = lambda: "",
    ) -> None:
        self.source = source
        self._load = load
        #: What else the desired state is made from (a node's labels, when node groups select
        #: by them), as a fingerprint: a change is a change of the desired state. ``inputs``
        #: reads them now; ``loaded_inputs`` says what the last load read.
        self._inputs = inputs
        self._loaded_inputs = loaded_inputs
        self._metrics = metrics
        self._events = events
        self._event_targets = event_targets
        self._refresh_watches = refresh_watches
        #: The desired state in force (None: no valid one yet).
        self.current: T | None = None
        #: The problems of the files as they are now, when invalid (one line each).
        self.invalid: tuple[str, ...] = ()
        self._fingerprint: str | None = None

    @staticmethod
    def for_node(
        source: DesiredSource,
        *,
        node: str,
        catalog: Catalog,
        metrics: WatchMetrics,
        events: Callable[[], EventSink | None],
        refresh_watches: Callable[[], None] | None = None,
        labels: Callable[[], Mapping[str, str]] | None = None,
        planned_for: Callable[[], DesiredNode | None] = lambda: None,
    ) -> DesiredFiles[DesiredNode]:
        """One node's desired state; an invalid one is also a Warning Event on each of the
        node's SRIOVGPUDevice objects (``kubectl describe`` shows it).

        ``labels`` reads the node's labels (None: no cluster). They are read only while a node
        group that selects by labels could select the node, then again at every check, so
        that labelling the node (or taking a label off) changes its desired state.
        ``planned_for`` gives the desired state the last reconcile planned: where node groups
        configure the node, its GPUs (the Events' objects) are known only from it."""
        by_labels = False  # whether the desired state in force depends on the labels
        read = ""  # the labels the last load read, as :func:`inputs` gives them

        def load(src: DesiredSource) -> DesiredNode:
            nonlocal by_labels, read
            desired = src.load_all(catalog=catalog)
            by_labels = bool(desired.needs_labels(node))
            now = labels() if by_labels and labels is not None else None
            read = "" if now is None else _labels_text(now)
            try:
                found = desired.node(node, now)
            except UsageError as exc:
                # A group selects by labels and there is no cluster to read them from: no
                # guess either way (the desired state cannot be applied here).
                raise ValidationError(exc.message) from None
            if found is None:
                log.warning(
                    "node %s is not in the desired state in %s: no GPU of this node is managed",
                    node,
                    src.path,
                )
                return DesiredNode(node)
            return found

        def targets(current: DesiredNode) -> Sequence[tuple[str, str]]:
            gpus = current.gpus
            if current.matched:
                # A node group's GPUs are known once the host is planned: the last run's.
                last = planned_for()
                gpus = () if last is None else last.gpus
            return [(SRIOV_GPU_KIND, object_name(node, str(g.address))) for g in gpus]

        def inputs() -> str:
            if not by_labels or labels is None:
                return ""
            try:
                return _labels_text(labels())
            except ReconcilerError as exc:
                return f"unreadable: {exc.message}"

        return DesiredFiles(
            source,
            load=load,
            metrics=metrics,
            events=events,
            event_targets=targets,
            refresh_watches=refresh_watches,
            inputs=inputs,
            loaded_inputs=lambda: read,
        )

    def watch_again(self) -> None:
        """Work out again which directories to watch for file events."""
        if self._refresh_watches is None:
            return
        try:
            self._refresh_watches()
        except Exception:
            log.exception(
                "cannot watch %s for changes (the rescan still notices them)", self.source.path
            )

    def changed_unread(self) -> bool:
        """The files' content differs from what was last read (a change no event announced)."""
        return self._fingerprint_now() != self._fingerprint

    def _fingerprint_now(self) -> str:
        return self.source.fingerprint() + self._inputs()

    def check(self) -> DesiredChange:
        """Read the desired state again if its content changed."""
        files = self.source.fingerprint()
        fingerprint = files + self._inputs()
        if fingerprint == self._fingerprint:
            return DesiredChange.NONE
        self._fingerprint = fingerprint
        try:
            loaded = self._load(self.source)
            # What the load itself read (it may need labels the last state did not).
            self._fingerprint = files + self._loaded_inputs()
        except ValidationError as exc:
            if self._fingerprint_now() != fingerprint:
                # Changed while we read it: a writer is not done (not every writer renames a
                # finished file into place). Read it again once it has been quiet.
                self._fingerprint = None
                return DesiredChange.UNSETTLED
            self._report_invalid(exc.problems or (Problem(exc.message),))
            return DesiredChange.NONE
        except ReconcilerError as exc:
            # What the desired state depends on could not be read (the node's labels): the
            # one in force stays, and the next check reads again.
            log.warning("cannot read what the desired state depends on: %s", exc.message)
            self._fingerprint = None
            return DesiredChange.NONE
        except Exception as exc:  # a loader bug must not take the loop down
            log.exception("cannot load the desired state from %s", self.source.path)
            self._report_invalid((Problem(f"internal error: {type(exc).__name__}: {exc}"),))
            return DesiredChange.NONE
        first = self.current is None
        if self.invalid:
            log.info("the desired state in %s is valid again", self.source.path)
        self.invalid = ()
        self._metrics.desired_valid.set(1)
        if not first:
            self._metrics.drift.labels(source="desired").inc()
            log.info("the desired state changed", extra={"path": str(self.source.path)})
        self.current = loaded
        return DesiredChange.FIRST if first else DesiredChange.CHANGED

    def _report_invalid(self, problems: tuple[Problem, ...]) -> None:
        self.invalid = tuple(str(p) for p in problems)
        self._metrics.desired_valid.set(0)
        self._metrics.errors.labels(kind="validation").inc()
        for problem in problems:
            log.error(
                "invalid desired state: %s",
                problem,
                extra={"file": problem.file, "line": problem.line, "column": problem.column},
            )
        if self.current is None:
            log.error("no valid desired state yet: nothing is changed until it is fixed")
        else:
            log.warning("the last valid desired state stays in force until this is fixed")
        self._record_invalid_event(problems)

    def _record_invalid_event(self, problems: tuple[Problem, ...]) -> None:
        """A Warning Event on each object the desired state in force names as a target."""
        targets = () if self.current is None else self._event_targets(self.current)
        if not targets:
            return  # no object is known to carry it
        try:
            events = self._events()
        except ReconcilerError as exc:
            log.warning("cannot record the invalid desired state as an Event: %s", exc.message)
            return
        if events is None:
            return
        # The loader lists at most 20 problems per file and counts the rest: the log has them.
        more = (
            f" (and {len(problems) - 1} more lines in the agent's log)" if len(problems) > 1 else ""
        )
        message = (
            f"desired state invalid: {problems[0]}{more}; the last valid desired state stays "
            "in force"
        )[:EVENT_MESSAGE_MAX]
        for kind, name in targets:
            events.event(
                kind,
                name,
                reason="InvalidDesiredState",
                message=message,
                type="Warning",
            )


def _labels_text(labels: Mapping[str, str]) -> str:
    return json.dumps(sorted(labels.items()))


class HostDrift:
    """The host's fingerprint against its baseline."""

    def __init__(self, signature: Callable[[], str], *, metrics: WatchMetrics) -> None:
        self._signature = signature
        self._metrics = metrics
        self.baseline: str | None = None
        #: The last fingerprint :meth:`take` returned.
        self.last: str | None = None

    def take(self) -> str:
        """The fingerprint now, taken before an observation (remembered as :attr:`last`)."""
        self.last = self._signature()
        return self.last

    def adopt(self, fingerprint: str | None) -> None:
        self.baseline = fingerprint

    def drifted(self) -> bool:
        """The host differs from the baseline (counted and logged when it does)."""
        if self._signature() == self.baseline:
            return False
        self._metrics.drift.labels(source="host").inc()
        log.info("the host changed: reconciling", extra={"reason": "host"})
        return True


class ClusterDrift:
    """Our cluster objects' fingerprint against its baseline; nothing without a cluster."""

    def __init__(
        self,
        signature: Callable[[], str] | None,
        *,
        metrics: WatchMetrics,
        what: str = "our cluster objects",
    ) -> None:
        self._signature = signature
        self._metrics = metrics
        self._what = what
        self._unreachable = False
        self.baseline: str | None = None
        #: The last fingerprint :meth:`take` returned (None: no cluster, or it did not answer).
        self.last: str | None = None

    def take(self) -> str | None:
        """The fingerprint now (remembered as :attr:`last`); None when there is no cluster or
        it did not answer."""
        self.last = self._read()
        return self.last

    def adopt(self, fingerprint: str | None) -> None:
        self.baseline = fingerprint

    def drifted(self) -> bool:
        """Our objects differ from the baseline (counted and logged when they do); a cluster
        that does not answer has not changed as far as anyone can tell."""
        fingerprint = self._read()
        if fingerprint is None or fingerprint == self.baseline:
            return False
        self._metrics.drift.labels(source="cluster").inc()
        log.info("%s changed: reconciling", self._what, extra={"reason": "cluster"})
        return True

    def _read(self) -> str | None:
        if self._signature is None:
            return None
        try:
            fingerprint = self._signature()
        except ReconcilerError as exc:
            if not self._unreachable:
                log.warning("cannot read %s: %s", self._what, exc.message)
                self._metrics.errors.labels(kind="cluster").inc()
            self._unreachable = True
            return None
        if self._unreachable:
            log.info("the cluster answers again")
        self._unreachable = False
        return fingerprint
