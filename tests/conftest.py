"""Fixtures for the cross-package tests."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository's root directory."""
    return REPO
