"""The continuous reconcile loop (``vgpuctl watch``). Built in a later issue."""
