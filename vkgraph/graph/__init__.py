"""Layer 2: values, nodes, the submission policy, ComputeGraph and its helpers, the load report."""

from .compute_graph import ComputeGraph, DeviceFacts
from .nodes import DispatchNode, PrepackNode
from .packers import PACKERS, Packer
from .report import LoadReport
from .values import ArraySource, LazySource, Tensor, TensorRef

__all__ = [
    "ArraySource",
    "ComputeGraph",
    "DeviceFacts",
    "DispatchNode",
    "LazySource",
    "LoadReport",
    "PACKERS",
    "Packer",
    "PrepackNode",
    "Tensor",
    "TensorRef",
]
