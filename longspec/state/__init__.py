"""What the generations on one model share: the prompt cache, the suffix index of earlier
outputs, captured CUDA graphs and kept step buffers, and the per-model state that holds them."""
