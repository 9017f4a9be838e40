"""The ground truth, NumPy only: arrays and their validation, exact attention, the online
softmax and merge_states, write_kv/copy_blocks, the block allocator and the error model.

The block-table format is explained once, in :mod:`pagedattn.spec.arrays`.
"""

from pagedattn.spec.allocator import AppendResult, BlockAllocator, BlockTableArrays
from pagedattn.spec.arrays import (
    AttentionProblem,
    check_copy_blocks,
    check_merge_states,
    check_paged_attention,
    check_write_kv,
)
from pagedattn.spec.case import AttentionCase
from pagedattn.spec.error_model import Tolerance, merge_tolerance, tolerance
from pagedattn.spec.exact import ExactResult, exact_attention, exact_attention_problem
from pagedattn.spec.kv_ops import copy_blocks, write_kv
from pagedattn.spec.online_softmax import SoftmaxState, merge_states
from pagedattn.spec.prefix_cache import PrefixCache, block_hash

__all__ = [
    "AppendResult",
    "AttentionCase",
    "AttentionProblem",
    "BlockAllocator",
    "BlockTableArrays",
    "ExactResult",
    "PrefixCache",
    "SoftmaxState",
    "Tolerance",
    "block_hash",
    "check_copy_blocks",
    "check_merge_states",
    "check_paged_attention",
    "check_write_kv",
    "copy_blocks",
    "exact_attention",
    "exact_attention_problem",
    "merge_states",
    "merge_tolerance",
    "tolerance",
    "write_kv",
]
