"""Rendering: one strict Jinja environment over templates/<backend>/ (environment.py), each kernel family rendering
its own kernels through it (plan/<family>.render); sources.py renders a plan's kernels for a target."""
