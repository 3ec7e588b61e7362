"""qrgen's version: part of every generated file's header and of every cache key."""
__version__ = "0.1.0"
