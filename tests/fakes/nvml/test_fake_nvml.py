"""The fake libnvidia-ml.so.1, driven by the real nvidia-ml-py (pynvml) as the collection drives NVML."""

from __future__ import annotations

import configparser
import ctypes
import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

CONFIGS = Path(__file__).resolve().parent / "configs"
SHIPPED = sorted(path.name for path in CONFIGS.glob("*.ini"))

# Variables that steer the fake: cleared so a sourced .simhost/env cannot leak into a test.
STEERING = ("FAKE_NVML_CONFIG", "FAKE_NVML_CALL_LOG", "FAKE_NVML_DEBUG", "NVML_MPS_DEVICE_ENUMERATION", "LD_LIBRARY_PATH", "LD_PRELOAD")

EXPORTED = frozenset(
    {
        "nvmlInit",
        "nvmlInit_v2",
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetComputeMode",
        "nvmlDeviceSetComputeMode",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetAttributes_v2",
    }
)
# The MIG entry points: their recipes need a MIG device handle (test_every_mig_function_returns_an_injected_fault).
MIG_FUNCTIONS = frozenset(name for name in EXPORTED if name != "nvmlDeviceGetMigMode" and ("Mig" in name or "InstanceId" in name or "Attributes" in name))

# What each shipped host must be (from the collection's test plan): per GPU name, MiB, compute capability, MIG.
SPEC: dict[str, list[tuple[str, int, tuple[int, int], str]]] = {
    "h100x4.ini": [("NVIDIA H100 80GB HBM3", 81559, (9, 0), "disabled")] * 4,
    "a100x8.ini": [("NVIDIA A100-SXM4-40GB", 40960, (8, 0), "disabled")] * 8,
    "mixed.ini": [("Tesla T4", 15360, (7, 5), "unsupported"), ("NVIDIA A100-SXM4-80GB", 81920, (8, 0), "enabled")],
    "v100x2.ini": [("Tesla V100-SXM2-16GB", 16384, (7, 0), "unsupported")] * 2,
    "h200x1.ini": [("NVIDIA H200", 143771, (9, 0), "disabled")],
    "t4x4.ini": [("Tesla T4", 15360, (7, 5), "unsupported")] * 4,
    "l40s.ini": [("NVIDIA L40S", 46068, (8, 9), "unsupported")],
    "p100x2.ini": [("Tesla P100-PCIE-16GB", 16280, (6, 0), "unsupported")] * 2,
    "h200x1-r590.ini": [("NVIDIA H200", 143771, (9, 0), "disabled")],
    "a100x1-mig7.ini": [("NVIDIA A100-SXM4-80GB", 81920, (8, 0), "enabled")],
    "h100x1-mig.ini": [("NVIDIA H100 80GB HBM3", 81559, (9, 0), "enabled")],
    "mig-mixed.ini": [("NVIDIA H100 80GB HBM3", 81559, (9, 0), "disabled")] + [("NVIDIA H100 80GB HBM3", 81559, (9, 0), "enabled")] * 2,
}
# Per shipped MIG host: GPU index -> the profiles of its MIG devices, in MIG index order (the ready configs).
MIG_SPEC: dict[str, dict[int, list[str]]] = {
    "a100x1-mig7.ini": {0: ["1g.10gb"] * 7},
    "h100x1-mig.ini": {0: ["3g.40gb", "2g.20gb", "1g.10gb"]},
    "mig-mixed.ini": {1: ["3g.40gb", "2g.20gb", "1g.10gb"], 2: []},
}

CHILD_PRELUDE = """
import json
import os
import sys
import pynvml

def outcome(fn, *args):
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        return type(err).__name__
"""


def scrubbed_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in STEERING}
    env.update(extra)
    return env


def run_child(code: str, env: dict[str, str], *args: str, **popen: Any) -> Any:
    """Runs CHILD_PRELUDE + code in a fresh interpreter and returns the JSON it printed last."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(code), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **popen,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ini(path: Path) -> configparser.ConfigParser:
    """An independent reading of a config, to compare what the library reports against."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser


def gpu_sections(parser: configparser.ConfigParser) -> list[configparser.SectionProxy]:
    count = sum(1 for name in parser.sections() if re.fullmatch(r"gpu\d+", name))
    return [parser[f"gpu{index}"] for index in range(count)]


@dataclass
class Host:
    """A simulated host: the fake library plus a private, writable copy of one config."""

    lib: Path
    config: Path

    def env(self, **extra: str) -> dict[str, str]:
        return scrubbed_env(LD_LIBRARY_PATH=str(self.lib.parent), FAKE_NVML_CONFIG=str(self.config), **extra)

    def run(self, code: str, *args: str, **extra_env: str) -> Any:
        return run_child(code, self.env(**extra_env), *args)

    def set_key(self, section: str, key: str, value: str) -> None:
        """Sets key in [section], replacing its line or adding one under the header."""
        lines = self.config.read_text(encoding="utf-8").splitlines()
        start = lines.index(f"[{section}]")
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
        for i in range(start + 1, end):
            if lines[i].split("=", 1)[0].strip() == key:
                lines[i] = f"{key} = {value}"
                break
        else:
            lines.insert(start + 1, f"{key} = {value}")
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def replace(self, old: str, new: str) -> None:
        text = self.config.read_text(encoding="utf-8")
        assert old in text
        self.config.write_text(text.replace(old, new), encoding="utf-8")

    def compute_modes(self) -> list[str]:
        return [section.get("compute_mode", "default") for section in gpu_sections(ini(self.config))]

    def uuids(self) -> list[str]:
        return [section["uuid"] for section in gpu_sections(ini(self.config))]


@pytest.fixture(name="make_host")
def fixture_make_host(tmp_path: Path, fake_nvml_lib: Path) -> Callable[..., Host]:
    def make(config: str = "h100x4.ini") -> Host:
        copy = tmp_path / config
        shutil.copyfile(CONFIGS / config, copy)
        return Host(lib=fake_nvml_lib, config=copy)

    return make


@pytest.fixture(name="nvml")
def fixture_nvml(fake_nvml_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The real pynvml, bound in this process to the fake library by absolute path, not yet initialized."""
    for name in STEERING:
        monkeypatch.delenv(name, raising=False)
    lib = ctypes.CDLL(str(fake_nvml_lib))
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    yield pynvml
    # The library stays loaded across tests: drop every init this test left behind. Without a
    # config, no injected fault can refuse the shutdown.
    os.environ.pop("FAKE_NVML_CONFIG", None)
    for _attempt in range(1000):
        if lib.nvmlShutdown() != pynvml.NVML_SUCCESS:
            break


@pytest.fixture(name="raw")
def fixture_raw(nvml: ModuleType) -> ctypes.CDLL:
    """The same library through bare ctypes, for arguments pynvml never passes (NULL, short buffers)."""
    lib: ctypes.CDLL = nvml.nvmlLib
    return lib


@pytest.fixture(name="use_host")
def fixture_use_host(make_host: Callable[..., Host], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Host]:
    """Makes a host and points this process's FAKE_NVML_CONFIG at it."""

    def use(config: str = "h100x4.ini") -> Host:
        host = make_host(config)
        monkeypatch.setenv("FAKE_NVML_CONFIG", str(host.config))
        return host

    return use


# --------------------------------------------------------------------------------------------------
# Inventory


@pytest.mark.parametrize("config", SHIPPED)
def test_every_shipped_config_reports_its_whole_inventory(config: str, nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host(config)
    parser = ini(host.config)
    system = parser["system"]
    nvml.nvmlInit()

    assert nvml.nvmlSystemGetDriverVersion() == system["driver_version"]
    assert nvml.nvmlSystemGetCudaDriverVersion() == system.getint("cuda_driver_version")
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == system.getint("cuda_driver_version")
    assert nvml.nvmlSystemGetNVMLVersion() == f"{system.getint('cuda_driver_version') // 1000}.{system['driver_version']}"

    sections = gpu_sections(parser)
    assert nvml.nvmlDeviceGetCount() == len(sections) == len(SPEC[config])
    for index, (section, (name, mib, capability, mig)) in enumerate(zip(sections, SPEC[config])):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        assert nvml.nvmlDeviceGetName(handle) == section["name"] == name
        assert nvml.nvmlDeviceGetUUID(handle) == section["uuid"]
        assert nvml.nvmlDeviceGetIndex(handle) == index
        assert nvml.nvmlDeviceGetCudaComputeCapability(handle) == capability
        assert f"{capability[0]}.{capability[1]}" == section["compute_capability"]

        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        assert memory.total == mib * 1048576 == section.getint("memory_total_mib") * 1048576
        assert 0 < memory.used < memory.total
        assert memory.free == memory.total - memory.used
        memory_v2 = nvml.nvmlDeviceGetMemoryInfo(handle, nvml.nvmlMemory_v2)
        assert memory_v2.version == nvml.nvmlMemory_v2
        assert memory_v2.total == memory.total
        assert memory_v2.reserved > 0
        assert memory_v2.reserved + memory_v2.used + memory_v2.free == memory_v2.total

        assert section["mig_mode"] == mig
        if mig == "unsupported":
            with pytest.raises(nvml.NVMLError_NotSupported):
                nvml.nvmlDeviceGetMigMode(handle)
        else:
            enable = {"enabled": nvml.NVML_DEVICE_MIG_ENABLE, "disabled": nvml.NVML_DEVICE_MIG_DISABLE}
            assert nvml.nvmlDeviceGetMigMode(handle) == [enable[mig], enable[section["mig_pending"]]]

        persistence = {"enabled": nvml.NVML_FEATURE_ENABLED, "disabled": nvml.NVML_FEATURE_DISABLED}
        assert nvml.nvmlDeviceGetPersistenceMode(handle) == persistence[section["persistence_mode"]]
        assert nvml.nvmlDeviceGetComputeMode(handle) == nvml.NVML_COMPUTEMODE_DEFAULT

        pci = nvml.nvmlDeviceGetPciInfo(handle)
        assert pci.busId == section["pci_bus_id"]
        assert pci.busIdLegacy == section["pci_bus_id"][4:]
        assert pci.pciDeviceId == int(section["pci_device_id"], 16)
        assert pci.pciDeviceId & 0xFFFF == 0x10DE  # NVIDIA's PCI vendor id


def test_shipped_uuids_are_unique_across_configs_and_unambiguous_by_prefix_within_one() -> None:
    every: list[str] = []
    for config in SHIPPED:
        parser = ini(CONFIGS / config)
        uuids = [section["uuid"] for section in gpu_sections(parser)]
        for name in parser.sections():
            if re.fullmatch(r"gpu\d+\.mig\d+", name):
                assert re.fullmatch(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", parser[name]["uuid"])
                every.append(parser[name]["uuid"])
        for uuid in uuids:
            assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid), uuid
        assert len({uuid[:12] for uuid in uuids}) == len(uuids), config
        every += uuids
    assert len(set(every)) == len(every)


def test_the_format_example_in_the_readme_is_a_valid_host(nvml: ModuleType, make_host: Callable[..., Host], monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (CONFIGS.parent.parent / "README.md").read_text(encoding="utf-8")
    example = re.search(r"```ini\n(.*?)```", readme, re.S)
    assert example is not None
    host = make_host()
    host.config.write_text(example.group(1), encoding="utf-8")
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(host.config))
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 1
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetUUID(handle) == ini(host.config)["gpu0"]["uuid"]
    assert nvml.nvmlDeviceGetPciInfo(handle).busId == ini(host.config)["gpu0"]["pci_bus_id"]


def test_shipped_configs_are_the_ones_the_collection_relies_on() -> None:
    assert set(SHIPPED) == set(SPEC)


def test_handles_by_index_and_by_uuid_name_the_same_gpu(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host("a100x8.ini")
    nvml.nvmlInit()
    for index, uuid in enumerate(host.uuids()):
        by_uuid = nvml.nvmlDeviceGetHandleByUUID(uuid)
        assert nvml.nvmlDeviceGetIndex(by_uuid) == index
        assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index)) == uuid


def test_unknown_uuid_is_not_found_and_index_past_the_end_is_invalid(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    use_host()
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(4)


def test_config_is_reread_on_every_call_and_old_handles_follow_it(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host()
    nvml.nvmlInit()
    first, last = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(3)
    host.set_key("gpu0", "name", "NVIDIA H100 PCIe")
    assert nvml.nvmlDeviceGetName(first) == "NVIDIA H100 PCIe"

    # the host loses its last GPU: its handle no longer names a device
    text = host.config.read_text(encoding="utf-8")
    host.config.write_text(text[: text.index("[gpu3]")], encoding="utf-8")
    assert nvml.nvmlDeviceGetCount() == 3
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetName(last)


def test_bad_arguments_get_the_codes_nvml_documents(raw: ctypes.CDLL, use_host: Callable[..., Host]) -> None:
    use_host()
    assert raw.nvmlInit_v2() == pynvml.NVML_SUCCESS
    handle = ctypes.c_void_p()
    assert raw.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(0), ctypes.byref(handle)) == pynvml.NVML_SUCCESS
    buf = ctypes.create_string_buffer(96)

    assert raw.nvmlDeviceGetCount_v2(None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert raw.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(0), None) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert raw.nvmlDeviceGetHandleByUUID(None, ctypes.byref(ctypes.c_void_p())) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert raw.nvmlDeviceGetName(None, buf, ctypes.c_uint(96)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert raw.nvmlDeviceGetName(ctypes.c_void_p(0x1234), buf, ctypes.c_uint(96)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert raw.nvmlDeviceGetName(handle, None, ctypes.c_uint(96)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert raw.nvmlDeviceGetComputeMode(handle, None) == pynvml.NVML_ERROR_INVALID_ARGUMENT

    name = b"NVIDIA H100 80GB HBM3"
    assert raw.nvmlDeviceGetName(handle, buf, ctypes.c_uint(len(name))) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert raw.nvmlDeviceGetName(handle, buf, ctypes.c_uint(len(name) + 1)) == pynvml.NVML_SUCCESS
    assert buf.value == name
    assert raw.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(4)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert raw.nvmlDeviceGetUUID(handle, buf, ctypes.c_uint(10)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE


def test_memory_info_v2_refuses_a_struct_of_another_version(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    use_host()
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0), version=0x01000028)


# --------------------------------------------------------------------------------------------------
# Loading and initialization


def test_exports_exactly_the_implemented_entry_points(fake_nvml_lib: Path) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run([nm, "-D", "--defined-only", str(fake_nvml_lib)], capture_output=True, text=True, check=True)
    symbols = {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}
    assert symbols == EXPORTED


def test_unimplemented_function_raises_function_not_found(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    use_host()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetUtilizationRates(handle)


def write_garbage(path: Path) -> None:
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00garbage\x00\xff")


INVALID_CONFIGS: dict[str, Callable[[Host], None]] = {
    "missing file": lambda host: host.config.unlink(),
    "binary garbage": lambda host: write_garbage(host.config),
    "not an ini file": lambda host: host.config.write_text("this is not a GPU host\n", encoding="utf-8"),
    "no [system] section": lambda host: host.config.write_text("[gpu0]\nname = x\n", encoding="utf-8"),
    "gap in the GPU sections": lambda host: host.replace("[gpu1]", "[gpu7]"),
    "two GPUs share a uuid": lambda host: host.set_key("gpu1", "uuid", host.uuids()[0]),
    "a misspelt key": lambda host: host.set_key("gpu0", "compute_mdoe", "default"),
    "a misspelt GPU section": lambda host: host.replace("[gpu3]", "[GPU3]"),
    "a bad compute mode": lambda host: host.set_key("gpu0", "compute_mode", "exclusive"),
    "exclusive_thread stored": lambda host: host.set_key("gpu0", "compute_mode", "exclusive_thread"),
    "a fault for a function not exported": lambda host: host.set_key("system", "fail.nvmlDeviceGetTemperature", "15"),
    "a system-wide function failed per GPU": lambda host: host.set_key("gpu0", "fail.nvmlDeviceGetCount", "15"),
    "a required key missing": lambda host: host.replace("memory_total_mib = 81559\n", ""),
}


def test_unset_config_is_a_host_without_a_loaded_driver(nvml: ModuleType) -> None:
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()


@pytest.mark.parametrize("breakage", sorted(INVALID_CONFIGS))
def test_unreadable_or_invalid_config_is_a_host_without_a_loaded_driver(breakage: str, nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host()
    INVALID_CONFIGS[breakage](host)
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_debug_variable_says_why_a_config_was_refused(
    nvml: ModuleType, use_host: Callable[..., Host], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    host = use_host()
    host.set_key("gpu2", "compute_mdoe", "default")
    monkeypatch.setenv("FAKE_NVML_DEBUG", "1")
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()
    assert re.search(r"fake-nvml: .*h100x4\.ini:\d+: unknown key 'compute_mdoe'", capfd.readouterr().err)


def test_library_absent_from_the_search_path_raises_library_not_found(make_host: Callable[..., Host]) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml installed")
    host = make_host()
    result = run_child("print(json.dumps(outcome(pynvml.nvmlInit)))", scrubbed_env(FAKE_NVML_CONFIG=str(host.config)))
    assert result == "NVMLError_LibraryNotFound"


def test_calls_before_init_and_after_the_last_shutdown_are_uninitialized(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    use_host()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlSystemGetDriverVersion()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()

    nvml.nvmlInit()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetCount() == 4, "init is reference-counted: one shutdown of two leaves it up"
    nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetName(handle)
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()


def test_every_init_entry_point_counts_and_a_legacy_caller_sees_the_same_gpus(raw: ctypes.CDLL, use_host: Callable[..., Host]) -> None:
    use_host("v100x2.ini")
    assert raw.nvmlInit() == pynvml.NVML_SUCCESS
    assert raw.nvmlInit_v2() == pynvml.NVML_SUCCESS
    assert raw.nvmlInitWithFlags(ctypes.c_uint(pynvml.NVML_INIT_FLAG_NO_GPUS)) == pynvml.NVML_SUCCESS
    count = ctypes.c_uint()
    assert raw.nvmlDeviceGetCount(ctypes.byref(count)) == pynvml.NVML_SUCCESS
    assert count.value == 2
    legacy, current = ctypes.c_void_p(), ctypes.c_void_p()
    assert raw.nvmlDeviceGetHandleByIndex(ctypes.c_uint(1), ctypes.byref(legacy)) == pynvml.NVML_SUCCESS
    assert raw.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(1), ctypes.byref(current)) == pynvml.NVML_SUCCESS
    assert legacy.value == current.value
    for _init in range(3):
        assert raw.nvmlShutdown() == pynvml.NVML_SUCCESS
    assert raw.nvmlShutdown() == pynvml.NVML_ERROR_UNINITIALIZED


# pynvml's own table, not the library's output: the strings real NVML returns for these codes.
ERROR_CODES = sorted(
    code
    for name, code in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and code in pynvml.NVMLError._errcode_to_string  # pylint: disable=protected-access
)
EXPECTED_STRINGS = {code: pynvml.NVMLError._errcode_to_string[code] for code in ERROR_CODES}  # pylint: disable=protected-access


@pytest.mark.parametrize("code", ERROR_CODES)
def test_error_strings_match_real_nvml(code: int, raw: ctypes.CDLL) -> None:
    raw.nvmlErrorString.restype = ctypes.c_char_p
    assert raw.nvmlErrorString(code).decode() == EXPECTED_STRINGS[code]


def test_error_string_needs_no_init_and_names_success(raw: ctypes.CDLL) -> None:
    raw.nvmlErrorString.restype = ctypes.c_char_p
    assert raw.nvmlErrorString(pynvml.NVML_SUCCESS) == b"Success"
    assert raw.nvmlErrorString(12345) == b"Unknown Error"


# --------------------------------------------------------------------------------------------------
# Compute mode


def test_compute_mode_set_in_one_process_is_seen_by_the_next(make_host: Callable[..., Host]) -> None:
    host = make_host()
    host.run("""
        pynvml.nvmlInit()
        pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(2), pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        print(json.dumps(None))
        """)
    modes = host.run("""
        pynvml.nvmlInit()
        print(json.dumps([pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(4)]))
        """)
    default, exclusive = pynvml.NVML_COMPUTEMODE_DEFAULT, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert modes == [default, default, exclusive, default]
    assert host.compute_modes() == ["default", "default", "exclusive_process", "default"]


SETTER = """
index, go = int(sys.argv[1]), sys.argv[2]
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(index)
while not os.path.exists(go):
    pass
# toggle many times so the setters really overlap; the last write leaves EXCLUSIVE_PROCESS
modes = [pynvml.NVML_COMPUTEMODE_PROHIBITED, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS] * 25
for mode in modes:
    pynvml.nvmlDeviceSetComputeMode(handle, mode)
print(json.dumps(pynvml.nvmlDeviceGetComputeMode(handle)))
"""


def test_eight_processes_setting_eight_gpus_at_once_lose_no_update(make_host: Callable[..., Host], tmp_path: Path) -> None:
    host = make_host("a100x8.ini")
    go = tmp_path / "go"
    setters = [
        subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, "-c", CHILD_PRELUDE + SETTER, str(index), str(go)],
            env=host.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(8)
    ]
    time.sleep(0.5)  # let every setter import pynvml and reach the start line
    go.touch()
    for setter in setters:
        stdout, stderr = setter.communicate(timeout=120)
        assert setter.returncode == 0, stderr
        assert json.loads(stdout) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert host.compute_modes() == ["exclusive_process"] * 8


def test_setting_a_mode_rewrites_only_that_gpus_line(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host()
    # a GPU whose section has no compute_mode line gets one; everything else stays byte for byte
    text = host.config.read_text(encoding="utf-8").replace("[gpu3]\n", "[gpu3]\n; rack 7, slot 4\n")
    text = re.sub(r"(\[gpu3\]\n(?:.*\n)*?)compute_mode = default\n", r"\1", text)
    host.config.write_text(text, encoding="utf-8")
    nvml.nvmlInit()
    nvml.nvmlDeviceSetComputeMode(nvml.nvmlDeviceGetHandleByIndex(3), nvml.NVML_COMPUTEMODE_PROHIBITED)
    nvml.nvmlDeviceSetComputeMode(nvml.nvmlDeviceGetHandleByIndex(1), nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    expected = text.replace("[gpu3]\n", "[gpu3]\ncompute_mode = prohibited\n")
    gpu1 = expected.index("[gpu1]")
    expected = expected[:gpu1] + expected[gpu1:].replace("compute_mode = default", "compute_mode = exclusive_process", 1)
    assert host.config.read_text(encoding="utf-8") == expected
    assert [p.name for p in host.config.parent.iterdir() if p.name.startswith("h100x4.ini.")] == ["h100x4.ini.lock"]


def test_exclusive_thread_is_refused_as_by_current_drivers(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceSetComputeMode(handle, nvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetComputeMode(handle, 7)
    assert nvml.nvmlDeviceGetComputeMode(handle) == nvml.NVML_COMPUTEMODE_DEFAULT
    assert host.compute_modes()[0] == "default"


def test_gpu_with_mig_enabled_refuses_compute_modes(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host("mixed.ini")
    nvml.nvmlInit()
    t4, a100 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMigMode(a100) == [nvml.NVML_DEVICE_MIG_ENABLE, nvml.NVML_DEVICE_MIG_ENABLE]
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceSetComputeMode(a100, nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    nvml.nvmlDeviceSetComputeMode(t4, nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert host.compute_modes() == ["exclusive_process", "default"]

    # MIG disabled (a reboot applied the pending change): the mode is settable again
    host.set_key("gpu1", "mig_mode", "disabled")
    host.set_key("gpu1", "mig_pending", "disabled")
    nvml.nvmlDeviceSetComputeMode(a100, nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert host.compute_modes() == ["exclusive_process", "exclusive_process"]


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to nobody needs root")
def test_require_root_refuses_setting_compute_mode_to_an_unprivileged_caller(fake_nvml_lib: Path) -> None:
    # nobody must reach the library and the config: a world-readable directory outside pytest's 0700 tree
    with tempfile.TemporaryDirectory(prefix="fake-nvml-") as shared:
        world = Path(shared)
        world.chmod(0o755)
        shutil.copyfile(fake_nvml_lib, world / fake_nvml_lib.name)
        config = world / "h100x4.ini"
        shutil.copyfile(CONFIGS / "h100x4.ini", config)
        host = Host(lib=world / fake_nvml_lib.name, config=config)
        host.set_key("system", "require_root", "true")
        config.chmod(0o644)
        code = """
            if len(sys.argv) > 1:  # drop to the given uid/gid before NVML is even loaded
                os.setgroups([])
                os.setgid(int(sys.argv[1]))
                os.setuid(int(sys.argv[1]))
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            print(json.dumps([os.geteuid(), outcome(pynvml.nvmlDeviceGetComputeMode, handle),
                              outcome(pynvml.nvmlDeviceSetComputeMode, handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)]))
            """
        unprivileged = run_child(code, host.env(HOME=shared), "65534", cwd=shared)
        assert unprivileged == [65534, pynvml.NVML_COMPUTEMODE_DEFAULT, "NVMLError_NoPermission"]
        assert host.compute_modes()[0] == "default"

        assert run_child(code, host.env())[2] is None  # root may
        assert host.compute_modes()[0] == "exclusive_process"


# --------------------------------------------------------------------------------------------------
# Fault injection


def test_system_fault_fails_that_function_on_every_gpu(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host()
    host.set_key("system", "fail.nvmlDeviceSetComputeMode", "4")
    nvml.nvmlInit()
    for index in range(4):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        with pytest.raises(nvml.NVMLError_NoPermission):
            nvml.nvmlDeviceSetComputeMode(handle, nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        assert nvml.nvmlDeviceGetComputeMode(handle) == nvml.NVML_COMPUTEMODE_DEFAULT
    assert host.compute_modes() == ["default"] * 4


def test_gpu_fault_fails_only_that_gpu(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host()
    host.set_key("gpu2", "fail.nvmlDeviceGetHandleByIndex", "NVML_ERROR_GPU_IS_LOST")
    host.set_key("gpu1", "fail.nvmlDeviceGetComputeMode", "3")
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(host.uuids()[2])) == 2
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByIndex(1))
    for index in (0, 3):
        assert nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByIndex(index)) == nvml.NVML_COMPUTEMODE_DEFAULT


def test_gpu_fault_overrides_the_system_fault_for_that_gpu(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host()
    host.set_key("system", "fail.nvmlDeviceGetName", "NVML_ERROR_GPU_IS_LOST")
    host.set_key("gpu3", "fail.nvmlDeviceGetName", "0")
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(3)) == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("key", ["fail.nvmlInit_v2", "fail.nvmlInitWithFlags", "fail.nvmlInit"])
def test_init_fault_under_any_init_name_fails_every_init_entry_point(key: str, nvml: ModuleType, raw: ctypes.CDLL, use_host: Callable[..., Host]) -> None:
    host = use_host()
    host.set_key("system", key, "9")
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()  # pynvml calls nvmlInitWithFlags
    assert raw.nvmlInit() == raw.nvmlInit_v2() == raw.nvmlInitWithFlags(ctypes.c_uint(0)) == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def call_recipes(raw: ctypes.CDLL, handle: ctypes.c_void_p, uuid: bytes) -> dict[str, Callable[[], int]]:
    """One valid call of every exported function that returns an nvmlReturn_t."""
    byref, c_uint, c_int = ctypes.byref, ctypes.c_uint, ctypes.c_int

    def text(fn: Callable[..., int], *args: Any) -> int:
        return fn(*args, ctypes.create_string_buffer(96), c_uint(96))

    memory_v2 = pynvml.c_nvmlMemory_v2_t()
    memory_v2.version = pynvml.nvmlMemory_v2
    return {
        "nvmlInit": raw.nvmlInit,
        "nvmlInit_v2": raw.nvmlInit_v2,
        "nvmlInitWithFlags": lambda: raw.nvmlInitWithFlags(c_uint(0)),
        "nvmlShutdown": raw.nvmlShutdown,
        "nvmlSystemGetDriverVersion": lambda: text(raw.nvmlSystemGetDriverVersion),
        "nvmlSystemGetNVMLVersion": lambda: text(raw.nvmlSystemGetNVMLVersion),
        "nvmlSystemGetCudaDriverVersion": lambda: raw.nvmlSystemGetCudaDriverVersion(byref(c_int())),
        "nvmlSystemGetCudaDriverVersion_v2": lambda: raw.nvmlSystemGetCudaDriverVersion_v2(byref(c_int())),
        "nvmlDeviceGetCount": lambda: raw.nvmlDeviceGetCount(byref(c_uint())),
        "nvmlDeviceGetCount_v2": lambda: raw.nvmlDeviceGetCount_v2(byref(c_uint())),
        "nvmlDeviceGetHandleByIndex": lambda: raw.nvmlDeviceGetHandleByIndex(c_uint(0), byref(ctypes.c_void_p())),
        "nvmlDeviceGetHandleByIndex_v2": lambda: raw.nvmlDeviceGetHandleByIndex_v2(c_uint(0), byref(ctypes.c_void_p())),
        "nvmlDeviceGetHandleByUUID": lambda: raw.nvmlDeviceGetHandleByUUID(ctypes.c_char_p(uuid), byref(ctypes.c_void_p())),
        "nvmlDeviceGetIndex": lambda: raw.nvmlDeviceGetIndex(handle, byref(c_uint())),
        "nvmlDeviceGetUUID": lambda: text(raw.nvmlDeviceGetUUID, handle),
        "nvmlDeviceGetName": lambda: text(raw.nvmlDeviceGetName, handle),
        "nvmlDeviceGetMemoryInfo": lambda: raw.nvmlDeviceGetMemoryInfo(handle, byref(pynvml.c_nvmlMemory_t())),
        "nvmlDeviceGetMemoryInfo_v2": lambda: raw.nvmlDeviceGetMemoryInfo_v2(handle, byref(memory_v2)),
        "nvmlDeviceGetCudaComputeCapability": lambda: raw.nvmlDeviceGetCudaComputeCapability(handle, byref(c_int()), byref(c_int())),
        "nvmlDeviceGetPciInfo_v3": lambda: raw.nvmlDeviceGetPciInfo_v3(handle, byref(pynvml.nvmlPciInfo_t())),
        "nvmlDeviceGetComputeMode": lambda: raw.nvmlDeviceGetComputeMode(handle, byref(c_uint())),
        "nvmlDeviceSetComputeMode": lambda: raw.nvmlDeviceSetComputeMode(handle, c_uint(pynvml.NVML_COMPUTEMODE_PROHIBITED)),
        "nvmlDeviceGetMigMode": lambda: raw.nvmlDeviceGetMigMode(handle, byref(c_uint()), byref(c_uint())),
        "nvmlDeviceGetPersistenceMode": lambda: raw.nvmlDeviceGetPersistenceMode(handle, byref(c_uint())),
    }


FAILABLE = sorted(EXPORTED - {"nvmlErrorString"} - MIG_FUNCTIONS)


@pytest.mark.parametrize("function", FAILABLE)
def test_every_exported_function_returns_an_injected_fault(function: str, raw: ctypes.CDLL, use_host: Callable[..., Host]) -> None:
    host = use_host()
    for _init in range(2):  # twice, so that the nvmlShutdown recipe can run twice
        assert raw.nvmlInit_v2() == pynvml.NVML_SUCCESS
    handle = ctypes.c_void_p()
    assert raw.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(0), ctypes.byref(handle)) == pynvml.NVML_SUCCESS
    recipes = call_recipes(raw, handle, host.uuids()[0].encode())
    assert set(recipes) == set(FAILABLE)
    assert recipes[function]() == pynvml.NVML_SUCCESS
    host.set_key("system", f"fail.{function}", "NVML_ERROR_UNKNOWN")
    assert recipes[function]() == pynvml.NVML_ERROR_UNKNOWN


# --------------------------------------------------------------------------------------------------
# Environment of the caller


def test_mps_device_enumeration_view_refuses_compute_mode_and_mig_calls(
    nvml: ModuleType, use_host: Callable[..., Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    host = use_host("mixed.ini")
    monkeypatch.setenv("NVML_MPS_DEVICE_ENUMERATION", "1")
    nvml.nvmlInit()
    a100 = nvml.nvmlDeviceGetHandleByIndex(1)
    for call, args in [
        (nvml.nvmlDeviceGetComputeMode, (a100,)),
        (nvml.nvmlDeviceSetComputeMode, (nvml.nvmlDeviceGetHandleByIndex(0), nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)),
        (nvml.nvmlDeviceGetMigMode, (a100,)),
        (nvml.nvmlDeviceGetPersistenceMode, (a100,)),
        (nvml.nvmlSystemGetDriverVersion, ()),
    ]:
        with pytest.raises(nvml.NVMLError_NotSupported):
            call(*args)
    # what nvml.h lists for the MPS view still answers
    assert nvml.nvmlDeviceGetCount() == 2
    assert nvml.nvmlDeviceGetName(a100) == "NVIDIA A100-SXM4-80GB"
    assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(host.uuids()[1])) == 1
    assert nvml.nvmlDeviceGetMemoryInfo(a100).total == 81920 * 1048576
    assert nvml.nvmlDeviceGetCudaComputeCapability(a100) == (8, 0)
    assert host.compute_modes() == ["default", "default"]

    # the view is chosen at the first init: after the last shutdown, a plain init sees physical GPUs again
    nvml.nvmlShutdown()
    monkeypatch.delenv("NVML_MPS_DEVICE_ENUMERATION")
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByIndex(1)) == nvml.NVML_COMPUTEMODE_DEFAULT


def test_mps_device_enumeration_view_refuses_init_without_attach(raw: ctypes.CDLL, use_host: Callable[..., Host], monkeypatch: pytest.MonkeyPatch) -> None:
    use_host()
    monkeypatch.setenv("NVML_MPS_DEVICE_ENUMERATION", "1")
    assert raw.nvmlInitWithFlags(ctypes.c_uint(pynvml.NVML_INIT_FLAG_NO_ATTACH)) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert raw.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())) == pynvml.NVML_ERROR_UNINITIALIZED


def test_call_log_records_each_call_with_the_callers_pid(make_host: Callable[..., Host], tmp_path: Path) -> None:
    host = make_host()
    log = tmp_path / "calls.log"
    code = """
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(pynvml.nvmlDeviceGetCount() - 1)
        pynvml.nvmlDeviceGetName(handle)
        pynvml.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        pynvml.nvmlShutdown()
        print(json.dumps(os.getpid()))
        """
    pids = [host.run(code, FAKE_NVML_CALL_LOG=str(log)) for _child in range(2)]
    lines = [line.split(" ") for line in log.read_text(encoding="utf-8").splitlines()]
    sequence = ["nvmlInitWithFlags", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetName", "nvmlDeviceSetComputeMode", "nvmlShutdown"]
    for pid in pids:
        assert [function for logged_pid, function in lines if logged_pid == str(pid)] == sequence
    assert len(lines) == 2 * len(sequence)


def test_call_log_counts_failed_and_uninitialized_calls_too(make_host: Callable[..., Host], tmp_path: Path) -> None:
    host = make_host()
    log = tmp_path / "calls.log"
    host.set_key("system", "fail.nvmlInit", "9")
    result = host.run(
        """
        print(json.dumps([outcome(pynvml.nvmlInit), outcome(pynvml.nvmlInit)]))
        """,
        FAKE_NVML_CALL_LOG=str(log),
    )
    assert result == ["NVMLError_DriverNotLoaded"] * 2
    assert [line.split(" ")[1] for line in log.read_text(encoding="utf-8").splitlines()] == ["nvmlInitWithFlags"] * 2


# --------------------------------------------------------------------------------------------------
# MIG devices


def mig_sections(parser: configparser.ConfigParser, gpu: int) -> list[configparser.SectionProxy]:
    count = sum(1 for name in parser.sections() if re.fullmatch(rf"gpu{gpu}\.mig\d+", name))
    return [parser[f"gpu{gpu}.mig{index}"] for index in range(count)]


@pytest.mark.parametrize("config", sorted(MIG_SPEC))
def test_mig_hosts_list_their_mig_devices_under_the_parent(config: str, nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host(config)
    parser = ini(host.config)
    nvml.nvmlInit()
    for index in range(nvml.nvmlDeviceGetCount()):
        parent = nvml.nvmlDeviceGetHandleByIndex(index)
        assert nvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0
        profiles = MIG_SPEC[config].get(index)
        if profiles is None:  # MIG disabled: no MIG devices (nvml.h: zero when not enabled)
            assert nvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 0
            with pytest.raises(nvml.NVMLError_NotSupported):
                nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
            continue
        assert nvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
        sections = mig_sections(parser, index)
        assert [section["profile"] for section in sections] == profiles
        for mig_index, section in enumerate(sections):
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, mig_index)
            assert nvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
            assert nvml.nvmlDeviceGetUUID(mig) == section["uuid"]
            assert nvml.nvmlDeviceGetName(mig) == "%s MIG %s" % (parser[f"gpu{index}"]["name"], section["profile"])
            assert nvml.nvmlDeviceGetIndex(mig) == mig_index
            assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == index
            assert nvml.nvmlDeviceGetMemoryInfo(mig).total == section.getint("memory_total_mib") * 1048576
            assert nvml.nvmlDeviceGetGpuInstanceId(mig) == section.getint("gpu_instance_id")
            assert nvml.nvmlDeviceGetComputeInstanceId(mig) == section.getint("compute_instance_id")
            attributes = nvml.nvmlDeviceGetAttributes(mig)
            slices = int(section["profile"].split("g.")[0])
            assert (attributes.multiprocessorCount, attributes.gpuInstanceSliceCount, attributes.computeInstanceSliceCount,
                    attributes.memorySizeMB) == (section.getint("multiprocessor_count"), slices, slices, section.getint("memory_total_mib"))
            assert nvml.nvmlDeviceGetCudaComputeCapability(mig) == nvml.nvmlDeviceGetCudaComputeCapability(parent)
            assert nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(section["uuid"])) == mig_index
        if len(sections) < 7:
            with pytest.raises(nvml.NVMLError_NotFound):
                nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, len(sections))
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)


def test_mig_device_handles_refuse_gpu_wide_calls_and_gpus_refuse_mig_only_ones(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host("mig-mixed.ini")
    nvml.nvmlInit()
    whole, parent = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    for call in (nvml.nvmlDeviceGetComputeMode, nvml.nvmlDeviceGetMigMode, nvml.nvmlDeviceGetPersistenceMode):
        with pytest.raises(nvml.NVMLError_NotSupported):
            call(mig)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceSetComputeMode(mig, nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    for call in (nvml.nvmlDeviceGetAttributes, nvml.nvmlDeviceGetGpuInstanceId, nvml.nvmlDeviceGetComputeInstanceId):
        with pytest.raises(nvml.NVMLError_NotSupported):  # nvml.h: attributes are for MIG device handles only
            call(whole)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(whole)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(mig, 0)
    assert host.compute_modes() == ["default"] * 3


def test_a_destroyed_and_recreated_instance_has_a_new_uuid_and_the_old_handle_goes_invalid(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host("h100x1-mig.ini")
    nvml.nvmlInit()
    parent = nvml.nvmlDeviceGetHandleByIndex(0)
    old = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2))
    last = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    host.replace(old, "MIG-00000000-1111-2222-3333-444444444444")
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)) == "MIG-00000000-1111-2222-3333-444444444444"
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID(old)
    # the instance destroyed: nvml.h says its handle must be requested again; the fake answers InvalidArgument
    text = host.config.read_text(encoding="utf-8")
    host.config.write_text(text[:text.index("[gpu0.mig2]")], encoding="utf-8")
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetUUID(last)
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)


@pytest.mark.parametrize("breakage", [
    ("[gpu0.mig1]", "[gpu0.mig5]"),                       # not contiguous
    ("uuid = MIG-", "uuid = GPU-"),                       # a MIG UUID starts MIG-
    ("profile = 2g.20gb", "profile = large"),             # not a profile name
    ("mig_mode = enabled", "mig_mode = disabled"),        # MIG devices on a GPU without MIG
    ("gpu_instance_id = 3", "gpu_instance_id = 2"),       # two devices on one (GI, CI)
    ("memory_total_mib = 20096", "memory_total_mib = 99999"),  # more than the GPU has
    ("multiprocessor_count = 32", "multiprocessor_count = 0"),
    ("[gpu0.mig1]", "[gpu0.mig1]\nfail.nvmlDeviceGetUUID = 3"),  # faults are per GPU
])
def test_invalid_mig_sections_are_a_host_without_a_loaded_driver(breakage: tuple[str, str], nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host("h100x1-mig.ini")
    host.replace(*breakage)
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()


def test_mig_uuid_used_twice_is_refused(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host("h100x1-mig.ini")
    parser = ini(host.config)
    host.replace(parser["gpu0.mig1"]["uuid"], parser["gpu0.mig0"]["uuid"])
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()


def test_a_1c_profile_takes_its_slices_from_the_name(nvml: ModuleType, use_host: Callable[..., Host]) -> None:
    host = use_host("h100x1-mig.ini")
    host.replace("profile = 3g.40gb", "profile = 1c.3g.40gb")
    nvml.nvmlInit()
    attributes = nvml.nvmlDeviceGetAttributes(nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 0))
    assert (attributes.gpuInstanceSliceCount, attributes.computeInstanceSliceCount) == (3, 1)


@pytest.mark.parametrize("function", sorted(MIG_FUNCTIONS))
def test_every_mig_function_returns_an_injected_fault_of_its_gpu(function: str, raw: ctypes.CDLL, use_host: Callable[..., Host]) -> None:
    host = use_host("h100x1-mig.ini")
    assert raw.nvmlInit_v2() == pynvml.NVML_SUCCESS
    parent, mig = ctypes.c_void_p(), ctypes.c_void_p()
    byref, c_uint = ctypes.byref, ctypes.c_uint
    assert raw.nvmlDeviceGetHandleByIndex_v2(c_uint(0), byref(parent)) == pynvml.NVML_SUCCESS
    assert raw.nvmlDeviceGetMigDeviceHandleByIndex(parent, c_uint(0), byref(mig)) == pynvml.NVML_SUCCESS
    recipes = {
        "nvmlDeviceGetMaxMigDeviceCount": lambda: raw.nvmlDeviceGetMaxMigDeviceCount(parent, byref(c_uint())),
        "nvmlDeviceGetMigDeviceHandleByIndex": lambda: raw.nvmlDeviceGetMigDeviceHandleByIndex(parent, c_uint(0), byref(ctypes.c_void_p())),
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": lambda: raw.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, byref(ctypes.c_void_p())),
        "nvmlDeviceIsMigDeviceHandle": lambda: raw.nvmlDeviceIsMigDeviceHandle(mig, byref(c_uint())),
        "nvmlDeviceGetGpuInstanceId": lambda: raw.nvmlDeviceGetGpuInstanceId(mig, byref(c_uint())),
        "nvmlDeviceGetComputeInstanceId": lambda: raw.nvmlDeviceGetComputeInstanceId(mig, byref(c_uint())),
        "nvmlDeviceGetAttributes_v2": lambda: raw.nvmlDeviceGetAttributes_v2(mig, byref(pynvml.c_nvmlDeviceAttributes())),
    }
    assert set(recipes) == MIG_FUNCTIONS
    assert recipes[function]() == pynvml.NVML_SUCCESS
    host.set_key("gpu0", f"fail.{function}", "NVML_ERROR_GPU_IS_LOST")
    assert recipes[function]() == pynvml.NVML_ERROR_GPU_IS_LOST
    raw.nvmlShutdown()


def test_the_gpu_mig_check_passes_on_the_fake_and_skips_without_mig(make_host: Callable[..., Host], tmp_path: Path) -> None:
    """tests/gpu/mig_check.py holds the fake to what a real MIG host must answer (its NVML part, without MPS)."""
    script = CONFIGS.parent.parent.parent / "gpu" / "mig_check.py"
    host = make_host("mig-mixed.ini")
    env = host.env(PATH="/usr/bin:/bin")
    proc = subprocess.run([sys.executable, str(script), "--no-mps", "--json", str(tmp_path / "mig.json")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "mig.json").read_text(encoding="utf-8"))
    assert report["checks"] and all(item["ok"] for item in report["checks"]), [i for i in report["checks"] if not i["ok"]]
    assert len([m for g in report["gpus"] for m in g["migs"] if m["rc"] == 0]) == 3
    plain = make_host("h100x4.ini")
    proc = subprocess.run([sys.executable, str(script)], env=plain.env(PATH="/usr/bin:/bin"), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("SKIP: no GPU in MIG mode"), proc.stdout + proc.stderr
