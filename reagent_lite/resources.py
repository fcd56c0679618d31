"""Files shipped with the package: the config JSON Schemas, the sample configs and the
config reference (`docs/CONFIG.md`).

In a source checkout (and an editable install) they are the repository's own `schemas/`,
`sample_configs/` and `docs/CONFIG.md`; a built wheel carries copies under
`reagent_lite/_data/` (copied by `setup.py` at build time), so an installed package finds
them without the checkout. Nothing here writes: an installed package is read-only.
"""

from __future__ import annotations

from pathlib import Path

from reagent_lite.errors import ConfigError

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent
PACKAGED_DATA = _PACKAGE / "_data"


def in_checkout() -> bool:
    """Whether this package is imported from a source checkout (its files are the
    repository's, and regenerating schemas there is allowed)."""
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "schemas").is_dir()


def schema_dir() -> Path:
    """The directory of `dqn_workflow.schema.json` and `parametric_dqn_workflow.schema.json`."""
    return (_CHECKOUT if in_checkout() else PACKAGED_DATA) / "schemas"


def sample_configs_dir() -> Path:
    return (_CHECKOUT if in_checkout() else PACKAGED_DATA) / "sample_configs"


def config_reference_path() -> Path:
    """The generated config reference (`docs/CONFIG.md` in a checkout)."""
    return _CHECKOUT / "docs" / "CONFIG.md" if in_checkout() else PACKAGED_DATA / "CONFIG.md"


def sample_config_names() -> list[str]:
    """The shipped sample configs, e.g. `ci/dqn_1node.json`."""
    root = sample_configs_dir()
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json"))


def sample_config(name: str) -> Path:
    """The path of the shipped sample config `name` (e.g. `"ci/dqn_1node.json"`); its
    relative data and output paths resolve against the working directory when run."""
    path = sample_configs_dir() / name
    if not path.is_file() or name not in sample_config_names():
        raise ConfigError(
            f"sample config: no sample config named {name!r} (expected one of "
            f"{sample_config_names()})"
        )
    return path
