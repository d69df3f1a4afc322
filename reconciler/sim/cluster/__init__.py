"""A local Kubernetes API server with Harvester's and KubeVirt's kinds: ``vgpuctl sim cluster``.

``emulator.py`` is the in-process API server the test suite runs the unmodified ``kubernetes``
client against (its docstring lists what it enforces and what it does not emulate); its helpers
model the server's JSON patch (``jsonpatch.py``), structural schemas (``structural.py``),
server-side tables (``tables.py``) and ValidatingAdmissionPolicy (``admission.py``; policies need
the ``cel-python`` package, a development dependency: a simulated cluster seeds none).
``fleet.py`` builds a simulated fleet on it: N simulated hosts and their Node objects. It is a
server, so nothing here imports the ``kubernetes`` client.
"""
