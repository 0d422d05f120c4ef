# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU inventory and compute mode, through NVML (nvidia-ml-py); ``_selectors.py`` resolves device selectors.

``pynvml`` loads ``libnvidia-ml.so.1`` by soname at ``nvmlInit()``. One :class:`Nvml` session per
module run: initialised once, every query and change inside it, shut down at the end.
"""

from __future__ import annotations

import os
import re
import typing as t
from dataclasses import dataclass

from ._errors import DriverUpgradePendingError, InvalidParameterError, NvmlError

try:
    import pynvml
except ImportError as _exc:  # pragma: no cover - depends on the managed node
    pynvml = None
    PYNVML_IMPORT_ERROR: t.Optional[Exception] = _exc
else:
    PYNVML_IMPORT_ERROR = None

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


def check_multiuser(devices: t.Sequence[t.Any], param: str = 'multiuser') -> None:
    """The one refusal of a multi-user daemon on GPUs older than Volta (mps_daemon, mps_host and the role's preflight)."""
    old = [gpu for gpu in devices if gpu.compute_capability < VOLTA_CC]
    if old:
        raise InvalidParameterError(param, 'needs GPUs of compute capability 7.0 (Volta) or newer: %s %s older. The driver '
                                    'starts -multiuser-server below it, but clients that are not root then fail to connect; '
                                    'use multiuser=false (one server per user) on these GPUs' % (
                                        ', '.join('GPU %d (%s, %s, %d.%d)' % ((gpu.index, gpu.uuid, gpu.name) + gpu.compute_capability)
                                                  for gpu in old), 'is' if len(old) == 1 else 'are'))


# MPS clients per GPU: 16 before Volta, 48 from Volta on; NVIDIA's MPS documentation of the r590 drivers
# (CUDA 13.1) says 60, "increased from 48" on CUDA 13.0 and before.
PRE_VOLTA_CLIENTS = 16
VOLTA_CLIENTS = 48
R590_CLIENTS = 60
R590 = 590
# MIG (NVIDIA's MIG user guide): before R570 a CUDA process enumerates one MIG device and no whole GPU beside it;
# from R570 one compute instance per GPU instance. MPS on MIG runs one control daemon per MIG device.
# The compute slices of a GPU that MIG splits (A100, H100, H200: 7), when NVML does not say.
DEFAULT_MIG_SLICES = 7
_PROFILE = re.compile(r'(?:(\d+)c\.)?(\d+)g\.(\d+)gb')


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
    # A GPU in MIG mode: its MIG devices (compute instances), in NVML's MIG index order.
    mig_devices: t.Tuple['MigDevice', ...] = ()

    is_mig = False

    @property
    def max_mps_clients(self) -> int:
        """Clients per GPU under MPS: 16 before Volta (compute capability 7.0), 48 from it on, 60 on r590+ drivers."""
        return mps_client_cap(self.compute_capability, self.driver_version)

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig_current)

    @property
    def address(self) -> str:
        """How a resource's ``devices`` names it: the index (``1``), or ``1:0`` for a MIG device."""
        return str(self.index)

    @property
    def label(self) -> str:
        """``GPU 1 (GPU-...)`` or ``MIG device 1:0 (3g.40gb, MIG-...)``, for messages."""
        return 'GPU %d (%s)' % (self.index, self.uuid)

    def mig_listing(self) -> str:
        """This GPU's MIG devices for a message: ``1:0 (3g.40gb, MIG-...), ...``, or a note that it has none."""
        if not self.mig_devices:
            return 'it has no MIG devices yet (create GPU and compute instances first, e.g. with nvidia-mig-parted)'
        return 'its MIG devices are %s' % ', '.join(mig.short for mig in self.mig_devices)

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
            'mig_devices': [mig.facts() for mig in self.mig_devices],
        }


@dataclass(frozen=True)
class MigDevice(Gpu):
    """One MIG device (a compute instance in its GPU instance) of a GPU in MIG mode, as NVML reports it.

    ``index`` is its GPU's; ``memory_total_mib`` its own; ``compute_capability`` and the driver its GPU's.
    """

    mig_index: int = 0
    parent_uuid: str = ''
    profile: str = ''
    gpu_instance_id: t.Optional[int] = None
    compute_instance_id: t.Optional[int] = None
    multiprocessor_count: t.Optional[int] = None
    gpu_instance_slices: t.Optional[int] = None
    compute_instance_slices: t.Optional[int] = None
    max_slices: int = DEFAULT_MIG_SLICES

    is_mig = True

    @property
    def max_mps_clients(self) -> int:
        """The GPU's cap "lowered proportionally to the Compute Instance size" (MIG user guide), rounded down, at least 1."""
        cap = mps_client_cap(self.compute_capability, self.driver_version)
        slices = self.compute_instance_slices or profile_slices(self.profile)[1]
        if not slices or not self.max_slices:
            return cap
        return max(1, cap * min(slices, self.max_slices) // self.max_slices)

    @property
    def address(self) -> str:
        return '%d:%d' % (self.index, self.mig_index)

    @property
    def short(self) -> str:
        """``1:0 (3g.40gb, MIG-...)``, as lists of MIG devices name it."""
        return '%s (%s, %s)' % (self.address, self.profile, self.uuid)

    @property
    def label(self) -> str:
        return 'MIG device ' + self.short

    def summary(self) -> t.Dict[str, t.Any]:
        return {'index': self.index, 'uuid': self.uuid, 'name': self.name, 'mig': self.address, 'profile': self.profile}

    def facts(self) -> t.Dict[str, t.Any]:
        return {
            'index': self.mig_index,
            'address': self.address,
            'uuid': self.uuid,
            'name': self.name,
            'profile': self.profile,
            'memory_total_mib': self.memory_total_mib,
            'multiprocessor_count': self.multiprocessor_count,
            'gpu_instance_id': self.gpu_instance_id,
            'compute_instance_id': self.compute_instance_id,
            'gpu_instance_slices': self.gpu_instance_slices,
            'compute_instance_slices': self.compute_instance_slices,
            'max_mps_clients': self.max_mps_clients,
            'parent_uuid': self.parent_uuid,
        }


def profile_slices(profile: str) -> t.Tuple[t.Optional[int], t.Optional[int]]:
    """(GPU instance slices, compute instance slices) from a profile name: ``3g.40gb`` -> (3, 3), ``1c.3g.40gb`` -> (3, 1)."""
    match = _PROFILE.fullmatch(profile or '')
    if not match:
        return None, None
    gi = int(match.group(2))
    return gi, int(match.group(1)) if match.group(1) else gi


def is_mig_uuid(uuid: str) -> bool:
    """Whether a device name is a MIG device's (``MIG-<uuid>`` or the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``)."""
    return uuid[:4].upper() == 'MIG-'


def all_devices(gpus: t.Sequence[Gpu]) -> t.List[Gpu]:
    """Every GPU and, after each GPU in MIG mode, its MIG devices."""
    out: t.List[Gpu] = []
    for gpu in gpus:
        out.append(gpu)
        out.extend(gpu.mig_devices)
    return out


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
            if getattr(exc, 'value', None) == getattr(self._lib, 'NVML_ERROR_LIB_RM_VERSION_MISMATCH', 18):
                raise DriverUpgradePendingError.of(exc) from exc
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
                uuid = _text(self._call(what, lib.nvmlDeviceGetUUID, handle))
                capability = (int(major), int(minor))
                driver_text = None if driver is None else _text(driver)
                migs = self._mig_devices(handle, index, uuid, capability, driver_text) if mig is not None and mig[0] else ()
                gpus.append(Gpu(
                    index=index,
                    uuid=uuid,
                    name=_text(self._call(what, lib.nvmlDeviceGetName, handle)),
                    memory_total_mib=int(memory.total) // (1024 * 1024),
                    compute_capability=capability,
                    compute_mode=_MODE_NAMES.get(mode, 'unknown') if mode is not None else 'unsupported',
                    mig_current=None if mig is None else bool(mig[0]),
                    mig_pending=None if mig is None else bool(mig[1]),
                    persistence_mode=None if persistence is None else bool(persistence),
                    driver_version=driver_text,
                    mig_devices=migs,
                ))
            self._gpus = gpus
        return self._gpus

    def _mig_devices(self, handle: t.Any, index: int, parent_uuid: str, capability: t.Tuple[int, int],
                     driver: t.Optional[str]) -> t.Tuple['MigDevice', ...]:
        """The MIG devices of a GPU in MIG mode (none on a driver without the MIG calls)."""
        lib = self._lib
        slots = self._optional(lib.nvmlDeviceGetMaxMigDeviceCount, handle)
        if not slots:
            return ()
        found = []
        for mig_index in range(int(slots)):
            what = 'GPU %d, MIG device %d' % (index, mig_index)
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
            except lib.NVMLError_NotFound:
                continue  # an empty slot: no compute instance there
            except lib.NVMLError as exc:
                raise NvmlError('%s: %s' % (what, describe_nvml_error(exc))) from exc
            name = _text(self._call(what, lib.nvmlDeviceGetName, mig))
            memory_mib = int(self._call(what, lib.nvmlDeviceGetMemoryInfo, mig).total) // (1024 * 1024)
            attributes = self._optional(lib.nvmlDeviceGetAttributes, mig)
            gi_slices = int(attributes.gpuInstanceSliceCount) if attributes is not None else None
            ci_slices = int(attributes.computeInstanceSliceCount) if attributes is not None else None
            # NVML names a MIG device "<GPU name> MIG <profile>"; otherwise the profile is built from its attributes.
            profile = name.split(' MIG ', 1)[1].strip() if ' MIG ' in name else ''
            if not profile and attributes is not None:
                profile = ('%dc.' % ci_slices if ci_slices != gi_slices else '') + '%dg.%dgb' % (
                    gi_slices or 0, int(round(int(attributes.memorySizeMB) / 1024.0)))
            if gi_slices is None:
                gi_slices, ci_slices = profile_slices(profile)
            found.append(MigDevice(
                index=index, uuid=_text(self._call(what, lib.nvmlDeviceGetUUID, mig)), name=name, memory_total_mib=memory_mib,
                compute_capability=capability, compute_mode='unsupported', mig_current=None, mig_pending=None,
                persistence_mode=None, driver_version=driver, mig_index=mig_index, parent_uuid=parent_uuid, profile=profile,
                gpu_instance_id=self._optional(lib.nvmlDeviceGetGpuInstanceId, mig),
                compute_instance_id=self._optional(lib.nvmlDeviceGetComputeInstanceId, mig),
                multiprocessor_count=int(attributes.multiprocessorCount) if attributes is not None else None,
                gpu_instance_slices=gi_slices, compute_instance_slices=ci_slices, max_slices=int(slots)))
        return tuple(found)

    def refresh(self) -> None:
        """Forget what was read: the next :meth:`gpus` asks NVML again (another run may have changed modes)."""
        self._gpus = None

    def set_compute_mode(self, gpu: Gpu, mode: str) -> None:
        """Set ``mode`` (a key of COMPUTE_MODES) on ``gpu`` (never a MIG device: NVML refuses compute modes there)."""
        if gpu.is_mig or gpu.mig_enabled:
            raise NvmlError('%s: compute modes do not apply to a %s' % (gpu.label, 'MIG device' if gpu.is_mig else 'GPU in MIG mode'))
        try:
            self._lib.nvmlDeviceSetComputeMode(self.handle(gpu.index), COMPUTE_MODES[mode])
        except self._lib.NVMLError as exc:
            raise NvmlError('setting compute mode %s on GPU %d (%s): %s' % (
                mode.upper(), gpu.index, gpu.uuid, describe_nvml_error(exc))) from exc
        self._gpus = None
