"""The ``triton`` backend (entry point ``pagedattn.backends.triton.backend:TritonBackend``).

Importing this package imports neither triton nor torch; the kernels live in
``attention_kernels`` and ``cache_kernels`` and are imported when first launched.
"""
