"""The NumPy reference: paged attention computed the way a kernel computes it."""

from pagedattn.reference.paged import paged_attention_reference

__all__ = ["paged_attention_reference"]
