"""The wheel's one top-level package, ``kvlease``: the repository's package folders mapped under it.

The repository keeps its shape (``common/``, ``client/``, ``tablet/``, … beside ``kvlease/``); an installed
kvlease has only ``kvlease`` (``kvlease.common``, ``kvlease.client``, ``kvlease.tablet``, …), so a user's
own ``common`` package neither shadows ours nor is shadowed. Everything else is in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

#: the repository's folders that are sub-packages of ``kvlease`` once installed
FOLDERS = ("common", "leases", "client", "coordinator", "tablet", "spark_source", "ops")

setup(
    packages=["kvlease", *(f"kvlease.{folder}" for folder in FOLDERS),
              *(f"kvlease.{folder}.{sub}" for folder in FOLDERS for sub in find_packages(folder))],
    package_dir={"kvlease": "kvlease", **{f"kvlease.{folder}": folder for folder in FOLDERS}},
)
