"""Builds the fake libnvidia-ml.so.1 once per test session (or reuses the one FAKE_NVML_LIB names)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build import BuildError, fake_nvml_lib as build_fake_nvml_lib  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Absolute path of the fake library, named by its soname so LD_LIBRARY_PATH can find it."""
    try:
        return build_fake_nvml_lib(tmp_path_factory.mktemp("fake-nvml-lib"))
    except BuildError as exc:
        pytest.fail(str(exc))
