"""envs/examples."""
