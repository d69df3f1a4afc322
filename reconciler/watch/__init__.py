"""Watch mode: keep this node converged on its desired state, continuously (``vgpuctl watch``).

``worker.py`` is the schedule both loops run (read the desired state, rescan, reconcile, sleep);
``loop.py`` is the node agent's loop, a thin composition (one reconcile at a time) of:
``scheduler.py`` (when: triggers, rescans, debounce, the retry policy for transient and
permanent errors, stopping), ``changes.py`` (the change sources: the desired-state files with
the last valid state in force, host and cluster drift), ``reconcile.py`` (one run of the engine
and its reporting: logs, metrics, success or failure told to the scheduler and the probes),
``advertising.py`` (the embedded device plugins told of a host change between reconciles) and
``health.py`` (/healthz and /readyz). ``delegate.py`` is delegate mode's loop (every node
through Harvester's objects, from the replica that holds the Lease: ``leader.py``).
``source.py`` reads the desired-state file or directory afresh through link swaps;
``follow.py`` turns file events into wake-ups; ``signature.py`` fingerprints the host and the
cluster so an idle node costs a few reads per rescan; ``metrics.py``, ``endpoint.py`` and
``logs.py`` are the operations side (Prometheus, the HTTP endpoint, text or JSON logs);
``timing.py`` holds the pure pacing rules (backoff, debounce).

The CLI composes it: it builds the node's ports, the device plugins (grpc is loaded there, and
only for watch) and the cluster's signature. Importing this package loads neither watchdog nor
prometheus_client: they come with the modules that need them.
"""
