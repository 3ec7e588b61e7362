"""The one Jinja environment: strict (an undefined name is an error, never empty text), no autoescape, sources
kept byte for byte (trailing newlines kept, no block trimming). Compiled templates are kept on disk beside the
kernel cache (Jinja's bytecode cache, checked against each template's source and the Python version): a process
whose kernels are all cached renders their sources (the cache's keys) without compiling templates again.

A layer (`with layer("host"):`) renders the same kernel templates over other headers: a header of
templates/cuda/<layer>/ stands in for templates/cuda/'s of that name (the CPU layer, compile/host.py, replaces the
dialect and the headers of the sm_80 and sm_90 features)."""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from functools import lru_cache

from ..paths import cache_dir, template_dir

# jinja2 is imported on first use, not with qrgen: a process whose kernels the render index finds
# (compile/index.py) never needs it.


@lru_cache(maxsize=None)
def _bytecode_cache_class():
    import jinja2

    class BytecodeCache(jinja2.FileSystemBytecodeCache):
        """Jinja's file bytecode cache, where a folder that cannot be read or written costs a compile, never an
        error."""

        def load_bytecode(self, bucket) -> None:
            try:
                super().load_bytecode(bucket)
            except (OSError, EOFError, ValueError):
                bucket.reset()

        def dump_bytecode(self, bucket) -> None:
            try:
                super().dump_bytecode(bucket)
            except OSError:
                pass

    return BytecodeCache


def bytecode_cache():
    """A jinja2.BytecodeCache in the kernel cache's folder, or None where that cannot be made."""
    folder = cache_dir() / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _bytecode_cache_class()(str(folder))


_LAYER = contextvars.ContextVar("qrgen_template_layer", default="")


@contextmanager
def layer(name: str):
    """Templates rendered inside use the headers of layer `name` where it has them (the module's docstring)."""
    token = _LAYER.set(name)
    try:
        yield
    finally:
        _LAYER.reset(token)


def environment():
    """The jinja2.Environment (of the current layer)."""
    return _environment(_LAYER.get())


@lru_cache(maxsize=None)
def _environment(name: str):
    import jinja2

    loader = jinja2.FileSystemLoader(str(template_dir()))
    if name:
        override = jinja2.PrefixLoader({"cuda": jinja2.FileSystemLoader(str(template_dir() / "cuda" / name))})
        loader = jinja2.ChoiceLoader([override, loader])
    return jinja2.Environment(
        loader=loader,
        bytecode_cache=None if name else bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )


environment.cache_clear = _environment.cache_clear  # a new environment on the next call, as in a fresh process
