"""Builds the fake libnvidia-ml.so.1 once per test session (or reuses the one FAKE_NVML_LIB names)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SONAME = "libnvidia-ml.so.1"


def nvml_include() -> Path:
    """The directory holding NVIDIA's nvml.h: $NVML_INCLUDE, else the nvidia-nvml-dev package's."""
    configured = os.environ.get("NVML_INCLUDE")
    if configured:
        return Path(configured)
    spec = importlib.util.find_spec("nvidia")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        for header in sorted(Path(location).glob("cu*/include/nvml.h")):
            return header.parent
    raise FileNotFoundError("nvml.h not found: install nvidia-nvml-dev or set NVML_INCLUDE")


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Absolute path of the fake library, named by its soname so LD_LIBRARY_PATH can find it."""
    prebuilt = os.environ.get("FAKE_NVML_LIB")
    if prebuilt:
        path = Path(prebuilt).resolve()
        if not path.is_file() or path.name != SONAME:
            pytest.fail(f"FAKE_NVML_LIB={prebuilt} is not a built {SONAME}")
        return path
    out = tmp_path_factory.mktemp("fake-nvml-lib")
    build = subprocess.run(
        ["make", "-s", "-C", str(HERE), f"OUT={out}", f"NVML_INCLUDE={nvml_include()}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        pytest.fail(f"building the fake NVML failed:\n{build.stdout}{build.stderr}")
    return out / SONAME
