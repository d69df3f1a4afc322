"""Kubelet device plugin (gRPC v1beta1): advertises vGPU profiles. Built in a later issue."""
