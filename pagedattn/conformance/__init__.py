"""The conformance suite: whether a backend does what the contract says, and if not, the smallest case.

A pytest plugin (:mod:`.plugin`), public hypothesis strategies (:mod:`.strategies`), the
rules grouped by the contract's sections (``test_meaning``, ``test_never``,
``test_operations``, ``test_bad_input``), a report and replay command, and the mutants that
measure its strength. See docs/conformance.md.
"""
