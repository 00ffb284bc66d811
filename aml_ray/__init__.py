"""aml-ray: the neutral evaluation platform for agent memory systems (AML Add/Search contract) on Ray."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """``aml_ray.__version__``: the installed distribution's version (``0.0.0+local`` from a source tree without
    install), looked up on first use: ``importlib.metadata`` costs about 20 ms of every command's start,
    before the pre-flight's first request."""
    if name != "__version__":
        raise AttributeError(f"module 'aml_ray' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("aml-ray")
    except PackageNotFoundError:  # running from a source tree without install
        value = "0.0.0+local"
    globals()["__version__"] = value
    return value
