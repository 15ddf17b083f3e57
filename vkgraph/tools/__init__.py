"""Layer 4: what measures or predicts loads (bench, simulate, calibrate, tune), pictures of them
(plot), and a one-dispatch smoke test (smoke)."""
