"""Build the fake libnvidia-ml.so.1 for a test session (shared by every test suite that needs it)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SONAME = "libnvidia-ml.so.1"


class BuildError(Exception):
    """The fake library could not be built."""


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
    raise BuildError("nvml.h not found: install nvidia-nvml-dev or set NVML_INCLUDE")


def fake_nvml_lib(out: Path) -> Path:
    """Absolute path of the fake library: $FAKE_NVML_LIB when it names one, else built into ``out``."""
    prebuilt = os.environ.get("FAKE_NVML_LIB")
    if prebuilt:
        path = Path(prebuilt).resolve()
        if not path.is_file() or path.name != SONAME:
            raise BuildError(f"FAKE_NVML_LIB={prebuilt} is not a built {SONAME}")
        return path
    build = subprocess.run(
        ["make", "-s", "-C", str(HERE), f"OUT={out}", f"NVML_INCLUDE={nvml_include()}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        raise BuildError(f"building the fake NVML failed:\n{build.stdout}{build.stderr}")
    return out / SONAME
