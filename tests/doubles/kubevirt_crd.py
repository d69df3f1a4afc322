"""Moved to ``reconciler/sim/cluster/kubevirt_crd.py``: ``vgpuctl sim cluster`` ships it (issue 34).

This name stays the same module object, so the tests' imports, private names included, and their
monkeypatches keep working unchanged.
"""

import sys

from reconciler.sim.cluster import kubevirt_crd

sys.modules[__name__] = kubevirt_crd
