"""Kubernetes adapter (being written)."""
