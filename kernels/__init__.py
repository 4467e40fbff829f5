"""spade_kernels: fused log-prob/entropy and policy loss (torch reference, chunked CPU, Triton)."""
