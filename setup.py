"""Build hook only (the metadata is in pyproject.toml): the wheel carries copies of the
config JSON Schemas, the sample configs and the config reference under reagent_lite/_data/,
so that an installed package finds them without the source checkout
(reagent_lite/resources.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# (source in the checkout, destination under reagent_lite/_data/)
PACKAGE_DATA = [
    ("schemas", "schemas"),
    ("sample_configs", "sample_configs"),
    ("docs/CONFIG.md", "CONFIG.md"),
]


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "reagent_lite" / "_data"
        for source, dest in PACKAGE_DATA:
            src, dst = ROOT / source, target / dest
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


setup(cmdclass={"build_py": BuildWithData})
