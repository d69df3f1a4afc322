"""Test doubles, in one place: models of the real systems vgpuctl talks to, and their tests.

- ``cluster.FakeCluster``: the in-memory ``ClusterApi`` (the port, no HTTP) for unit tests.
- ``emulator.ApiServerEmulator``: a Kubernetes API server over HTTP for the real ``kubernetes``
  client (with ``admission`` evaluating deploy/'s ValidatingAdmissionPolicy and ``jsonpatch``).
- ``fake_kubelet.FakeKubelet``: the kubelet's device manager speaking real gRPC;
  ``registry``: only its Registration service, for unit tests of the plugin server.

The simulated NVIDIA host is not here: it is product code (``reconciler.sim``, ``vgpuctl sim``).
"""
