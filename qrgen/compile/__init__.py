"""Compiling rendered sources and caching the binaries, per backend: nvrtc.py (CUDA through NVRTC), cache.py (the
content-addressed on-disk cache they share)."""
