"""Test doubles for the kubelet device-plugin API: a fake kubelet speaking real gRPC."""
