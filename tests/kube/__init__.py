"""A Kubernetes API-server emulator for tests, and the tests of its semantics."""
