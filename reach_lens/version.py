"""The reach_lens version a run records (``Protocol.version``): the installed distribution's, else this source's."""

from importlib import metadata

__version__ = "0.2.0"  # keep equal to pyproject.toml's


def reach_lens_version() -> str:
    """The installed reach_lens version, else ``__version__``."""
    try:
        return metadata.version("reach_lens")
    except metadata.PackageNotFoundError:
        return __version__
