"""The perf suite: roofline work of each case, measured ceilings, timing, shapes and peers.

- :mod:`.roofline`: bytes a case must move and FLOPs it must do, from the spec;
- :mod:`.shapes`: the catalog of named shapes from real models and the named sets;
- :mod:`.inputs`: the host arrays of a case (shuffled blocks, rotated regions of one pool);
- :mod:`.timing`: synchronized timers, warm-up, medians;
- :mod:`.ceilings`: read bandwidth and matrix rate measured in the same run;
- :mod:`.peers`: cuDNN/flash SDPA on contiguous K/V and FlexAttention's paged attention;
- :mod:`.measure`: one case on one backend (through the Backend interface) or peer;
- :mod:`.cli`: ``pagedattn bench``.

Nothing here imports torch at import time.
"""
