"""Memory management you can measure.

- :mod:`pagedattn.simulate.workload`: request streams (generators and CSV traces);
- :mod:`pagedattn.simulate.contiguous`: contiguous preallocation, first fit;
- :mod:`pagedattn.simulate.paged`: paging through the spec's block allocator;
- :mod:`pagedattn.simulate.meter`: what a run measures, and its summary;
- :mod:`pagedattn.simulate.cli`: ``pagedattn simulate``, both replayed at one KV budget;
- :mod:`pagedattn.simulate.engine_loop`: an engine loop over any backend, checked
  against the spec after every step (a hypothesis state machine).
"""
