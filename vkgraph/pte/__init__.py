"""ExecuTorch programs (.pte) exported with ET-VK's VulkanPartitioner: the file readers
(:mod:`.reader`), a VkGraph to a ComputeGraph (:mod:`.lower`), the numpy kernels of the CPU
ops (:mod:`.kernels`) and a loaded program (:mod:`.program`)."""

from .program import IOSpec, OpUse, Program, list_ops, load_program

__all__ = ["IOSpec", "OpUse", "Program", "list_ops", "load_program"]
