"""aml-ray: the neutral evaluation platform for agent memory systems (AML Add/Search contract) on Ray."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aml-ray")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+local"
