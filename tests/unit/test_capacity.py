"""A pod's vGPU requests as the scheduler counts them (k8s.io/component-helpers
resource.PodRequests): containers summed; a restartable (sidecar) init container adds to them
for the pod's life; a regular init container runs alone after the sidecars started before it.
Values worked out by hand."""

from __future__ import annotations

from typing import Any

from reconciler.observe.capacity import pod_requests

Q = "nvidia.com/NVIDIA_A2-4Q"


def c(n: int | str, **extra: Any) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": {Q: n, "cpu": "1"}}, **extra}


def requests(**spec: Any) -> dict[str, int]:
    notes: list[str] = []
    got = pod_requests({"metadata": {"name": "p"}, "spec": spec}, notes)
    assert notes == []
    return got


def test_containers_are_summed_and_a_limit_alone_is_the_request() -> None:
    limit_only = {"name": "d", "resources": {"limits": {Q: "2"}}}
    assert requests(containers=[c(1), c("1"), limit_only]) == {Q: 4}


def test_init_containers_as_the_scheduler_counts_them() -> None:
    # A regular init container alone: the larger of it and the containers.
    assert requests(initContainers=[c(3)], containers=[c(1)]) == {Q: 3}
    assert requests(initContainers=[c(1)], containers=[c(2)]) == {Q: 2}
    # A sidecar adds to the containers; an init container after it runs beside it.
    sidecar = c(1, restartPolicy="Always")
    assert requests(initContainers=[sidecar], containers=[c(2)]) == {Q: 3}
    assert requests(initContainers=[sidecar, c(3)], containers=[c(2)]) == {Q: 4}
    # An init container before the sidecar does not run beside it.
    assert requests(initContainers=[c(3), sidecar], containers=[c(1)]) == {Q: 3}


def test_a_quantity_that_is_not_whole_devices_is_left_out_and_said() -> None:
    notes: list[str] = []
    got = pod_requests({"metadata": {"name": "p"}, "spec": {"containers": [c("500m"), c(1)]}},
                       notes)  # fmt: skip
    assert got == {Q: 1}
    assert notes == [f"pod p: {Q} request '500m' is not a whole number: ignored"]
