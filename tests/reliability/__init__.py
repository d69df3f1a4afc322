"""The reliability suite: crash safety, bad input, concurrency and faults survived, with figures.

``python -m tests.reliability.suite --size full|ci`` prints one JSON document of figures;
``test_reliability.py`` runs every scenario at the ci size under pytest and asserts the
invariants.
"""
