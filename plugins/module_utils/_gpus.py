# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU inventory, device selectors and compute mode, through NVML (nvidia-ml-py).

``pynvml`` loads ``libnvidia-ml.so.1`` by soname at ``nvmlInit()``. One :class:`Nvml` session per
module run: initialised once, every query and change inside it, shut down at the end.
"""

from __future__ import annotations

import os
import re
import typing as t
from dataclasses import dataclass

from ._errors import DeviceSelectionError, InvalidParameterError, NvmlError

try:
    import pynvml
except ImportError as _exc:  # pragma: no cover - depends on the managed node
    pynvml = None
    PYNVML_IMPORT_ERROR: t.Optional[Exception] = _exc
else:
    PYNVML_IMPORT_ERROR = None

HAS_PYNVML = pynvml is not None
PYNVML_PACKAGE = 'nvidia-ml-py'

# NVML's nvmlComputeMode_t values. EXCLUSIVE_THREAD (1) was removed from drivers and is not offered.
COMPUTE_MODES = {'default': 0, 'prohibited': 2, 'exclusive_process': 3}
_MODE_NAMES = {value: name for name, value in COMPUTE_MODES.items()}
_MODE_NAMES[1] = 'exclusive_thread'
# Set by tools that run inside MPS clients; makes NVML's compute-mode and MIG calls answer
# NotSupported, so it must never be set for this process.
MPS_ENUMERATION_VAR = 'NVML_MPS_DEVICE_ENUMERATION'
ENUMERATION_WARNING = ('%s was set in the module environment; it was ignored (it makes NVML compute-mode calls fail)'
                       % MPS_ENUMERATION_VAR)
VOLTA_CC = (7, 0)
# MPS clients per GPU: 16 before Volta, 48 from Volta on; NVIDIA's MPS documentation of the r590 drivers
# (CUDA 13.1) says 60, "increased from 48" on CUDA 13.0 and before.
PRE_VOLTA_CLIENTS = 16
VOLTA_CLIENTS = 48
R590_CLIENTS = 60
R590 = 590


def mps_client_cap(compute_capability: t.Tuple[int, int], driver_version: t.Optional[str]) -> int:
    """Clients per GPU under MPS for this compute capability on this driver (48 when the driver is unknown)."""
    if compute_capability < VOLTA_CC:
        return PRE_VOLTA_CLIENTS
    major = driver_major(driver_version)
    return R590_CLIENTS if major is not None and major >= R590 else VOLTA_CLIENTS


def driver_major(driver_version: t.Optional[str]) -> t.Optional[int]:
    """``590`` from ``590.44.01``; None when unknown."""
    head = (driver_version or '').split('.', 1)[0]
    return int(head) if head.isdigit() else None


_UUID_PREFIX = re.compile(r'GPU-[0-9a-fA-F-]*')


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    compute_capability: t.Tuple[int, int]
    compute_mode: str
    mig_current: t.Optional[bool]
    mig_pending: t.Optional[bool]
    persistence_mode: t.Optional[bool]
    driver_version: t.Optional[str] = None

    @property
    def max_mps_clients(self) -> int:
        """Clients per GPU under MPS: 16 before Volta (compute capability 7.0), 48 from it on, 60 on r590+ drivers."""
        return mps_client_cap(self.compute_capability, self.driver_version)

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig_current)

    def summary(self) -> t.Dict[str, t.Any]:
        """The short form modules return for a device."""
        return {'index': self.index, 'uuid': self.uuid, 'name': self.name}

    def facts(self) -> t.Dict[str, t.Any]:
        """Every field, in the form mps_info returns."""
        if self.mig_current is None:
            mig: t.Any = 'unsupported'
        else:
            mig = {'current': 'enabled' if self.mig_current else 'disabled',
                   'pending': 'enabled' if self.mig_pending else 'disabled'}
        return {
            'index': self.index,
            'uuid': self.uuid,
            'name': self.name,
            'memory_total_mib': self.memory_total_mib,
            'compute_capability': '%d.%d' % self.compute_capability,
            'compute_mode': self.compute_mode,
            'mig_mode': mig,
            'persistence_mode': self.persistence_mode,
            'max_mps_clients': self.max_mps_clients,
        }


def _text(value: t.Union[str, bytes]) -> str:
    return value.decode('utf-8', 'replace') if isinstance(value, bytes) else value


def describe_nvml_error(exc: Exception) -> str:
    """A user-facing sentence for an NVML failure."""
    if pynvml is not None and isinstance(exc, pynvml.NVMLError):
        code = getattr(exc, 'value', None)
        if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return 'the NVIDIA driver is not installed: libnvidia-ml.so.1 not found'
        if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
            return 'the NVIDIA driver is not loaded (NVML: %s)' % exc
        if code == pynvml.NVML_ERROR_NO_PERMISSION:
            return 'insufficient permissions (NVML: %s); changing the compute mode needs root' % exc
        return 'NVML: %s' % exc
    return str(exc)


class Nvml:
    """One NVML session: ``with Nvml() as nvml: nvml.gpus()``."""

    def __init__(self, lib: t.Any = None) -> None:
        self._lib = lib if lib is not None else pynvml
        self._gpus: t.Optional[t.List[Gpu]] = None
        self._active = False
        self.enumeration_var_was_set = False

    @property
    def has_binding(self) -> bool:
        """Whether nvidia-ml-py (pynvml) could be imported: without it NVML cannot be asked at all."""
        return self._lib is not None

    def __enter__(self) -> 'Nvml':
        if os.environ.pop(MPS_ENUMERATION_VAR, None) is not None:
            self.enumeration_var_was_set = True
        if self._lib is None:
            raise NvmlError('the Python package %s is required on the managed node (import pynvml failed: %s)'
                            % (PYNVML_PACKAGE, PYNVML_IMPORT_ERROR), missing_library=PYNVML_PACKAGE)
        try:
            self._lib.nvmlInit()
        except self._lib.NVMLError as exc:
            raise NvmlError(describe_nvml_error(exc)) from exc
        self._active = True
        return self

    def __exit__(self, *exc_info: t.Any) -> None:
        if self._active:
            self._active = False
            try:
                self._lib.nvmlShutdown()
            except self._lib.NVMLError:
                pass  # nothing useful to do about a failed shutdown; the process ends soon

    def _call(self, what: str, func: t.Callable[..., t.Any], *args: t.Any) -> t.Any:
        try:
            return func(*args)
        except self._lib.NVMLError as exc:
            raise NvmlError('%s: %s' % (what, describe_nvml_error(exc))) from exc

    def _optional(self, func: t.Callable[..., t.Any], *args: t.Any) -> t.Any:
        """Query something a GPU may not support; None when it does not."""
        try:
            return func(*args)
        except (self._lib.NVMLError_NotSupported, self._lib.NVMLError_FunctionNotFound):
            return None

    def driver_version(self) -> str:
        return _text(self._call('reading the driver version', self._lib.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports, as ``12.6``."""
        version = int(self._call('reading the CUDA driver version', self._lib.nvmlSystemGetCudaDriverVersion))
        return '%d.%d' % (version // 1000, (version % 1000) // 10)

    def handle(self, index: int) -> t.Any:
        return self._call('GPU %d' % index, self._lib.nvmlDeviceGetHandleByIndex, index)

    def gpus(self) -> t.List[Gpu]:
        """Every GPU of the host, read once per session."""
        if self._gpus is None:
            lib = self._lib
            count = self._call('counting GPUs', lib.nvmlDeviceGetCount)
            driver = self._optional(lib.nvmlSystemGetDriverVersion)
            gpus = []
            for index in range(count):
                handle = self.handle(index)
                what = 'GPU %d' % index
                memory = self._call(what, lib.nvmlDeviceGetMemoryInfo, handle)
                major, minor = self._call(what, lib.nvmlDeviceGetCudaComputeCapability, handle)
                mode = self._optional(lib.nvmlDeviceGetComputeMode, handle)
                mig = self._optional(lib.nvmlDeviceGetMigMode, handle)
                persistence = self._optional(lib.nvmlDeviceGetPersistenceMode, handle)
                gpus.append(Gpu(
                    index=index,
                    uuid=_text(self._call(what, lib.nvmlDeviceGetUUID, handle)),
                    name=_text(self._call(what, lib.nvmlDeviceGetName, handle)),
                    memory_total_mib=int(memory.total) // (1024 * 1024),
                    compute_capability=(int(major), int(minor)),
                    compute_mode=_MODE_NAMES.get(mode, 'unknown') if mode is not None else 'unsupported',
                    mig_current=None if mig is None else bool(mig[0]),
                    mig_pending=None if mig is None else bool(mig[1]),
                    persistence_mode=None if persistence is None else bool(persistence),
                    driver_version=None if driver is None else _text(driver),
                ))
            self._gpus = gpus
        return self._gpus

    def refresh(self) -> None:
        """Forget what was read: the next :meth:`gpus` asks NVML again (another run may have changed modes)."""
        self._gpus = None

    def set_compute_mode(self, gpu: Gpu, mode: str) -> None:
        """Set ``mode`` (a key of COMPUTE_MODES) on ``gpu``."""
        try:
            self._lib.nvmlDeviceSetComputeMode(self.handle(gpu.index), COMPUTE_MODES[mode])
        except self._lib.NVMLError as exc:
            raise NvmlError('setting compute mode %s on GPU %d (%s): %s' % (
                mode.upper(), gpu.index, gpu.uuid, describe_nvml_error(exc))) from exc
        self._gpus = None


def resolve_devices(selectors: t.Union[str, t.Sequence[t.Union[str, int]]], gpus: t.Sequence[Gpu],
                    param: str = 'devices') -> t.List[Gpu]:
    """Resolve ``all`` or a list of indices, UUIDs and unique UUID prefixes to GPUs, in the given order."""
    if not gpus:
        raise DeviceSelectionError('%s: this host has no GPUs (NVML reports none)' % param)
    if selectors == 'all' or selectors == ['all']:
        return list(gpus)
    if isinstance(selectors, str) or not selectors:
        raise InvalidParameterError(param, 'must be "all" or a non-empty list of GPU indices, UUIDs or unique UUID prefixes')
    chosen: t.List[Gpu] = []
    for selector in selectors:
        gpu = _resolve_one(selector, gpus, param)
        if gpu in chosen:
            raise DeviceSelectionError('%s: GPU %d (%s) is listed more than once (as %r)' % (param, gpu.index, gpu.uuid, selector))
        chosen.append(gpu)
    return chosen


def _resolve_one(selector: t.Union[str, int], gpus: t.Sequence[Gpu], param: str) -> Gpu:
    text = str(selector).strip()
    if isinstance(selector, bool) or not text:
        raise InvalidParameterError(param, '%r is not a GPU index, UUID or UUID prefix' % (selector,))
    if text.isdigit():
        index = int(text)
        for gpu in gpus:
            if gpu.index == index:
                return gpu
        raise DeviceSelectionError('%s: there is no GPU with index %d (this host has %d: 0-%d)' % (param, index, len(gpus), len(gpus) - 1))
    if text.startswith('MIG-'):
        raise DeviceSelectionError('%s: %r is a MIG device; give the whole GPU' % (param, text))
    if not _UUID_PREFIX.fullmatch(text):
        raise InvalidParameterError(param, '%r is not a GPU index, UUID (GPU-...) or unique UUID prefix' % text)
    matches = [gpu for gpu in gpus if gpu.uuid.lower().startswith(text.lower())]
    exact = [gpu for gpu in matches if gpu.uuid.lower() == text.lower()]
    if exact:
        return exact[0]
    if not matches:
        raise DeviceSelectionError('%s: no GPU has a UUID starting with %r' % (param, text))
    if len(matches) > 1:
        raise DeviceSelectionError('%s: %r is ambiguous: it is a prefix of %s' % (
            param, text, ', '.join('%s (GPU %d)' % (gpu.uuid, gpu.index) for gpu in matches)))
    return matches[0]


def visible_gpus(value: t.Optional[str], gpus: t.Sequence[Gpu]) -> t.List[Gpu]:
    """The GPUs a process with ``CUDA_VISIBLE_DEVICES=value`` uses, as CUDA reads the variable.

    Unset (None) is every GPU; each comma-separated item is an index, a UUID or a unique UUID prefix, and
    CUDA stops at the first item that names no GPU (the devices after it are not visible). An index is
    taken as NVML's: CUDA numbers fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, which differs
    from NVML's PCI order only on a host with mixed GPU models. A MIG device (``MIG-...``) is not a
    whole GPU and counts as none.
    """
    if value is None:
        return list(gpus)
    chosen: t.List[Gpu] = []
    for item in value.split(','):
        text = item.strip()
        if text.isdigit():
            found = [gpu for gpu in gpus if gpu.index == int(text)]
        elif _UUID_PREFIX.fullmatch(text):
            found = [gpu for gpu in gpus if gpu.uuid.lower().startswith(text.lower())]
            exact = [gpu for gpu in found if gpu.uuid.lower() == text.lower()]
            found = exact or found
        elif text.startswith('MIG-'):
            continue
        else:
            found = []
        if len(found) != 1:
            break
        if found[0] not in chosen:
            chosen.append(found[0])
    return chosen
