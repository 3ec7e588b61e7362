"""qrgen's development tools (README.md is the index); a package so that the tools share tools/cases.py."""
