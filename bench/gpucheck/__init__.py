"""Parts of bench/gpu_check.py: sizes, kernels, trainer (+ bf16 peak), export, sglang."""
