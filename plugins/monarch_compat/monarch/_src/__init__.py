"""The reference's private ``monarch._src`` paths that its own example programs
import, each mapped onto monarch-core's public API (docs/compat.md lists
them).  Other ``_src`` paths are not provided."""
