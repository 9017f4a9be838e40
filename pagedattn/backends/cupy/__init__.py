"""The ``cupy`` backend: hand-written CUDA C++ paged attention compiled at run time by NVRTC.

The kernels live as ``.cu`` files in ``kernels/``; :mod:`.specializations` lists every
template instantiation the backend declares, :mod:`.compile_check` compiles them all for
sm_90 without a GPU, :mod:`.planning` builds the per-batch work items on the host and
:mod:`.backend` launches them. Importing this package imports neither cupy nor torch.
"""
