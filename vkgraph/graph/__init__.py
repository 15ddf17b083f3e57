"""Layer 2: values, nodes, the submission scheduler, ComputeGraph and the load report."""
