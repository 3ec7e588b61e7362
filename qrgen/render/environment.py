"""The one Jinja environment: strict (an undefined name is an error, never empty text), no autoescape, sources
kept byte for byte (trailing newlines kept, no block trimming)."""
from __future__ import annotations

from functools import lru_cache

import jinja2

from ..paths import template_dir


@lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )
