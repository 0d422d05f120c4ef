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
# MIG (NVIDIA's MIG user guide): before R570 a CUDA process enumerates one MIG device and no whole GPU beside it;
# from R570 one compute instance per GPU instance. MPS on MIG runs one control daemon per MIG device.
# The compute slices of a GPU that MIG splits (A100, H100, H200: 7), when NVML does not say.
DEFAULT_MIG_SLICES = 7
_PROFILE = re.compile(r'(?:(\d+)c\.)?(\d+)g\.(\d+)gb')
_ADDRESS = re.compile(r'(\d+):(\d+)')
_LEGACY_MIG = re.compile(r'MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)')


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


def resolve_devices(selectors: t.Union[str, t.Sequence[t.Union[str, int]]], gpus: t.Sequence[Gpu],
                    param: str = 'devices', warnings: t.Optional[t.List[str]] = None) -> t.List[Gpu]:
    """Resolve ``all`` or a list of devices to GPUs and MIG devices, in the given order.

    A GPU is an index, a UUID or a unique UUID prefix; a MIG device is ``<gpu index>:<mig index>`` (as
    ``nvidia-smi -L`` lists them), its UUID (``MIG-...``) or the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``. ``all``
    is every GPU not in MIG mode (the GPUs it leaves out are named in ``warnings``). A GPU in MIG mode is
    refused naming its MIG devices; a MIG device must be its resource's only device.
    """
    if not gpus:
        raise DeviceSelectionError('%s: this host has no GPUs (NVML reports none)' % param)
    if selectors == 'all' or selectors == ['all']:
        whole = [gpu for gpu in gpus if not gpu.mig_enabled]
        left_out = [gpu for gpu in gpus if gpu.mig_enabled]
        if not whole:
            raise DeviceSelectionError('%s: "all" means every GPU not in MIG mode, and every GPU of this host is in MIG mode: '
                                       'list MIG devices instead (%s)' % (param, '; '.join(
                                           '%s: %s' % (gpu.label, gpu.mig_listing()) for gpu in left_out)))
        if left_out and warnings is not None:
            warnings.append('%s: "all" leaves out %s in MIG mode (%s); name MIG devices in a resource of their own to run '
                            'MPS on them' % (param, ', '.join(gpu.label for gpu in left_out),
                                             '; '.join('%s: %s' % (gpu.label, gpu.mig_listing()) for gpu in left_out)))
        return whole
    if isinstance(selectors, str) or not selectors:
        raise InvalidParameterError(param, 'must be "all" or a non-empty list of GPU indices, UUIDs or unique UUID prefixes, '
                                    'or of one MIG device (<gpu index>:<mig index> or MIG-<uuid>)')
    chosen: t.List[Gpu] = []
    for selector in selectors:
        gpu = _resolve_one(selector, gpus, param)
        if gpu in chosen:
            raise DeviceSelectionError('%s: %s is listed more than once (as %r)' % (param, gpu.label, selector))
        chosen.append(gpu)
    migs = [gpu for gpu in chosen if gpu.is_mig]
    if migs and len(chosen) > 1:
        what = ('%s cannot share a resource' % ' and '.join(gpu.label for gpu in migs) if len(migs) > 1 else
                '%s must be the only device of its resource (it is listed with %s)' % (
                    migs[0].label, ', '.join(gpu.label for gpu in chosen if not gpu.is_mig)))
        raise DeviceSelectionError(
            '%s: %s: MPS on MIG runs one control daemon per MIG device, and CUDA before driver R570 enumerates a single MIG '
            'device per process and no whole GPU beside it (from R570, one compute instance per GPU instance). Make one '
            'resource per MIG device' % (param, what))
    return chosen


def _resolve_one(selector: t.Union[str, int], gpus: t.Sequence[Gpu], param: str) -> Gpu:
    text = str(selector).strip()
    if isinstance(selector, bool) or not text:
        raise InvalidParameterError(param, '%r is not a GPU index, UUID or UUID prefix, nor a MIG device' % (selector,))
    if text.isdigit():
        index = int(text)
        for gpu in gpus:
            if gpu.index == index:
                return _whole(gpu, param)
        hint = ''
        if isinstance(selector, int) and index >= 60:
            # YAML 1.1 reads an unquoted 1:0 as the base-60 number 60.
            hint = '; an unquoted %d:%d is read by YAML as the number %d - quote MIG addresses ("%d:%d")' % (
                index // 60, index % 60, index, index // 60, index % 60)
        raise DeviceSelectionError('%s: there is no GPU with index %d (this host has %d: 0-%d)%s' % (
            param, index, len(gpus), len(gpus) - 1, hint))
    address = _ADDRESS.fullmatch(text)
    if address:
        return _mig_at(gpus, int(address.group(1)), int(address.group(2)), param)
    if is_mig_uuid(text):
        return _mig_by_uuid(gpus, text, param)
    if not _UUID_PREFIX.fullmatch(text):
        raise InvalidParameterError(param, '%r is not a GPU index, UUID (GPU-...) or unique UUID prefix, nor a MIG device '
                                    '(<gpu index>:<mig index>, MIG-<uuid> or MIG-GPU-<uuid>/<gi>/<ci>)' % text)
    matches = [gpu for gpu in gpus if gpu.uuid.lower().startswith(text.lower())]
    exact = [gpu for gpu in matches if gpu.uuid.lower() == text.lower()]
    if exact:
        return _whole(exact[0], param)
    if not matches:
        raise DeviceSelectionError('%s: no GPU has a UUID starting with %r' % (param, text))
    if len(matches) > 1:
        raise DeviceSelectionError('%s: %r is ambiguous: it is a prefix of %s' % (
            param, text, ', '.join('%s (GPU %d)' % (gpu.uuid, gpu.index) for gpu in matches)))
    return _whole(matches[0], param)


def _whole(gpu: Gpu, param: str) -> Gpu:
    """A whole GPU for a daemon; one in MIG mode is refused naming what to give instead."""
    if gpu.mig_enabled:
        raise DeviceSelectionError('%s: MIG is enabled on %s; a whole GPU in MIG mode cannot be given to a daemon: name one '
                                   'MIG device per resource instead - %s' % (param, gpu.label, gpu.mig_listing()))
    return gpu


def _mig_at(gpus: t.Sequence[Gpu], index: int, mig_index: int, param: str) -> Gpu:
    for gpu in gpus:
        if gpu.index != index:
            continue
        if not gpu.mig_enabled:
            raise DeviceSelectionError('%s: %d:%d names a MIG device, and MIG is not enabled on %s' % (param, index, mig_index, gpu.label))
        for mig in gpu.mig_devices:
            if mig.mig_index == mig_index:
                return mig
        raise DeviceSelectionError('%s: %s has no MIG device %d; %s' % (param, gpu.label, mig_index, gpu.mig_listing()))
    raise DeviceSelectionError('%s: there is no GPU with index %d (this host has %d: 0-%d)' % (param, index, len(gpus), len(gpus) - 1))


def _mig_by_uuid(gpus: t.Sequence[Gpu], text: str, param: str) -> Gpu:
    legacy = _LEGACY_MIG.fullmatch(text)
    for gpu in gpus:
        for mig in gpu.mig_devices:
            if legacy:
                if gpu.uuid.lower() == legacy.group(1).lower() and (mig.gpu_instance_id, mig.compute_instance_id) == (
                        int(legacy.group(2)), int(legacy.group(3))):
                    return mig
            elif mig.uuid.lower() == text.lower():
                return mig
    known = [mig for gpu in gpus for mig in gpu.mig_devices]
    raise DeviceSelectionError('%s: no MIG device is %r (a MIG device destroyed and created again has a new UUID); %s' % (
        param, text, 'this host\'s MIG devices are %s' % ', '.join(mig.short for mig in known)
        if known else 'this host has no MIG devices'))


def visible_gpus(value: t.Optional[str], gpus: t.Sequence[Gpu]) -> t.List[Gpu]:
    """The GPUs and MIG devices a process with ``CUDA_VISIBLE_DEVICES=value`` may use, as CUDA reads the variable.

    Unset (None) is every GPU and every MIG device (the most a process may claim); each comma-separated item
    is an index, a UUID, a unique UUID prefix or a MIG device UUID (``MIG-<uuid>``, ``MIG-GPU-<uuid>/<gi>/<ci>``),
    and CUDA stops at the first item that names nothing (the devices after it are not visible). An index is
    taken as NVML's: CUDA numbers fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, which differs from
    NVML's PCI order only on a host with mixed GPU models.
    """
    if value is None:
        return all_devices(gpus)
    chosen: t.List[Gpu] = []
    for item in value.split(','):
        text = item.strip()
        if text.isdigit():
            found = [gpu for gpu in gpus if gpu.index == int(text)]
        elif is_mig_uuid(text):
            try:
                found = [_mig_by_uuid(gpus, text, 'CUDA_VISIBLE_DEVICES')]
            except DeviceSelectionError:
                found = []
        elif _UUID_PREFIX.fullmatch(text):
            found = [gpu for gpu in gpus if gpu.uuid.lower().startswith(text.lower())]
            exact = [gpu for gpu in found if gpu.uuid.lower() == text.lower()]
            found = exact or found
        else:
            found = []
        if len(found) != 1:
            break
        # A GPU in MIG mode named by index or UUID: what CUDA makes of it is not documented; claim its MIG devices too.
        for device in [found[0]] + list(found[0].mig_devices):
            if device not in chosen:
                chosen.append(device)
    return chosen
