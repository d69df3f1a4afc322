"""Watch mode: keep this node converged on its desired state, continuously (``vgpuctl watch``).

``loop.py`` is the worker (one reconcile at a time, debounce, backoff, last valid desired state);
``source.py`` reads the desired-state file or directory afresh through link swaps;
``follow.py`` turns file events into wake-ups; ``signature.py`` fingerprints the host and the
cluster so an idle node costs a few reads per rescan; ``metrics.py``, ``endpoint.py`` and
``logs.py`` are the operations side (Prometheus, /healthz and /readyz, text or JSON logs);
``timing.py`` holds the pure pacing rules.

The CLI composes it: it builds the node's ports, the device plugins (grpc is loaded there, and
only for watch) and the cluster's signature. Importing this package loads neither watchdog nor
prometheus_client: they come with the modules that need them.
"""
