# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Device selectors: the GPUs and MIG devices that a resource's ``devices`` or ``CUDA_VISIBLE_DEVICES`` names."""

from __future__ import annotations

import re
import typing as t

from ._errors import DeviceSelectionError, InvalidParameterError
from ._gpus import Gpu, all_devices, is_mig_uuid

_ADDRESS = re.compile(r'(\d+):(\d+)')
_LEGACY_MIG = re.compile(r'MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)')
_UUID_PREFIX = re.compile(r'GPU-[0-9a-fA-F-]*')


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
    if text.isascii() and text.isdigit():
        index = int(text)
        for gpu in gpus:
            if gpu.index == index:
                return _whole(gpu, param)
        hint = ''
        if isinstance(selector, int) and any(gpu.index == index // 60 and gpu.mig_enabled for gpu in gpus):
            # YAML 1.1 reads an unquoted 1:0 as the base-60 number 60: said only where <gpu>:<mig> could be meant, a GPU
            # of that index in MIG mode (devices: [99] on a host without MIG gets no word about it).
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
