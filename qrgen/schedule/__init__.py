"""Schedules: the decisions that turn a problem into kernels (model.py), their files (files.py), the default
heuristic (heuristic.py) and the panel builders it shares with the tuner (panels.py)."""
