"""vgpuctl: declarative reconciliation of NVIDIA SR-IOV vGPUs.

Data flows one way: desired state (``desired``) and observed host (``observe``) meet in the pure
planner (``plan``); ``apply`` is the only layer that changes a host. See docs/architecture.md.
"""

__version__ = "0.1.0"
