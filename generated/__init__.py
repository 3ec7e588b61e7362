"""Modules written by `qrgen build`: one per (shape, batch, arch), each with its kernel sources beside it."""
