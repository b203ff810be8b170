"""The version has one source, ``perdure.__version__``; the package and the CLI report it."""

from __future__ import annotations

import importlib.metadata

from click.testing import CliRunner

import perdure
from perdure import cli


def test_the_installed_package_has_the_modules_version() -> None:
    assert importlib.metadata.version("perdure") == perdure.__version__


def test_perdure_version_prints_it() -> None:
    result = CliRunner().invoke(cli.cli, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"perdure, version {perdure.__version__}"
