# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One exception hierarchy for the collection's domain code.

Domain code raises these; each module turns them into ``fail_json`` exactly once, so the message a
user sees is the one written where the problem was understood.
"""

from __future__ import annotations

import typing as t


class MpsError(Exception):
    """Base of every error the collection reports to the user."""

    def __init__(self, msg: str, **details: t.Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.details = details

    def fail_kwargs(self) -> dict[str, t.Any]:
        """Keyword arguments for ``AnsibleModule.fail_json``."""
        result = dict(self.details)
        result['msg'] = self.msg
        return result


class InvalidParameterError(MpsError):
    """A module parameter is not of the valid form; raised before any side effect."""

    def __init__(self, param: str, msg: str, **details: t.Any) -> None:
        super().__init__('%s: %s' % (param, msg), param=param, **details)
        self.param = param

    def within(self, prefix: str) -> 'InvalidParameterError':
        """The same refusal, naming the option where the user wrote it: ``sm_partitions`` of a resource entry as
        ``resources[train].sm_partitions``."""
        own = '%s: ' % self.param
        details = {key: value for key, value in self.details.items() if key != 'param'}
        return InvalidParameterError('%s.%s' % (prefix, self.param), self.msg[len(own):] if self.msg.startswith(own) else self.msg,
                                     **details)


class UnsafePathError(MpsError):
    """A path is a symlink, owned by someone else, or writable by others where it must not be."""


class NvmlError(MpsError):
    """NVML is not usable (library or driver missing) or an NVML call failed."""


class DriverUpgradePendingError(NvmlError):
    """NVML answers "Driver/library version mismatch": the driver's user-space was upgraded under a loaded kernel module."""

    TEXT = (
        'driver upgrade pending: NVML answers "%s" - the NVIDIA driver\'s libraries were upgraded while the old kernel module '
        'is still loaded (a driver package upgraded without a reboot). Running MPS daemons keep serving with the old driver; '
        'nothing can be read or changed safely until the new module is loaded, so nothing was (a stop or teardown included): '
        'reboot (or stop every GPU process - each MPS daemon with "echo quit | nvidia-cuda-mps-control" and its '
        'CUDA_MPS_PIPE_DIRECTORY - reload the nvidia kernel modules and start nvidia-persistenced), then run again; each '
        'daemon still running from before is then restarted under the busy policy')

    @classmethod
    def of(cls, nvml_error: Exception) -> 'DriverUpgradePendingError':
        """The refusal for NVML's own words (``nvmlInit``'s NVML_ERROR_LIB_RM_VERSION_MISMATCH)."""
        return cls(cls.TEXT % nvml_error)


class DeviceSelectionError(MpsError):
    """Requested devices are unknown, duplicated, ambiguous, owned elsewhere or unusable."""


class ControlBinaryError(MpsError):
    """``nvidia-cuda-mps-control`` is missing, not executable, or answered something unparsable."""


class DaemonNotRunningError(MpsError):
    """No control daemon answers on the pipe directory."""


class DaemonTimeoutError(MpsError):
    """The control daemon did not answer, start or stop in time."""


class DaemonProtocolError(MpsError):
    """A running control daemon speaks another MPS protocol than the one the collection would drive it with."""


class ControlCommandError(MpsError):
    """The control daemon rejected a command (it still exits 0: the text says so)."""


class ReplayRejectedError(ControlCommandError):
    """The daemon answered, but refused one of the persisted limits replayed at its start."""
