"""The one Jinja environment: strict (an undefined name is an error, never empty text), no autoescape, sources
kept byte for byte (trailing newlines kept, no block trimming). Compiled templates are kept on disk beside the
kernel cache (Jinja's bytecode cache, checked against each template's source and the Python version): a process
whose kernels are all cached renders their sources (the cache's keys) without compiling templates again."""
from __future__ import annotations

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


@lru_cache(maxsize=None)
def environment():
    """The jinja2.Environment."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        bytecode_cache=bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )
