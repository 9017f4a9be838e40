"""The ``numpy`` backend: the kernel-style NumPy reference of :mod:`pagedattn.reference` behind the interface."""
