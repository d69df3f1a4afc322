"""Generated code for the kubelet device-plugin API v1beta1 (``just proto``; do not edit)."""
