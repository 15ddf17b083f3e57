"""Weight readers and model builders."""

import numpy as np


def outputs_match(got: np.ndarray, expect: np.ndarray, rtol: float = 1e-4) -> bool:
    """fp32 device output vs a float64 numpy reference: relative error of the whole output."""
    return bool(np.linalg.norm(np.asarray(got, np.float64) - expect) <= rtol * np.linalg.norm(expect))
