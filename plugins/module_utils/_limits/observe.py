# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a decision about a resource's limits reads of the run's view of the host: its persisted files, its daemon's
GPUs (:class:`DaemonScope`), whether that daemon runs with static partitioning, and its one control batch."""

from __future__ import annotations

import functools
import typing as t
from dataclasses import dataclass

from .._errors import DeviceSelectionError, MpsError
from .._gpus import Gpu, all_devices, is_mig_uuid
from .._resource.layout import ConfigPaths, ResourcePaths
from .._selectors import resolve_devices
from .._supervisor.liveness import Liveness
from .._supervisor.unit import parse_env
from .decide import ServerLimits
from .store import read_persisted

# Said of a recorded MIG device that NVML no longer reports.
MIG_GONE = (': the MIG instance was destroyed (and perhaps created again, with a new UUID - nvidia-smi -L lists the current '
            'ones); start the resource on its new MIG device first (gpufleet.mps.mps_daemon, or mps_host and the fleet role, '
            'which do both in one run), then set its limits')


@dataclass(frozen=True)
class DaemonScope:
    """The resource's daemon as the run's view has it."""

    gpus: t.List[Gpu]  # its GPUs, in ordinal order
    running: bool
    pid: t.Optional[int]
    liveness: Liveness
    record: t.Any  # its start record, read with its liveness
    # The device order the commands file must follow is known (else the next start writes it).
    order_known: bool
    # Whether the daemon's GPUs are known: it runs, or was started (its record), or its environment file
    # names them. Not before the first start of a new resource - the role's order.
    scope_known: bool


def file_reader(view: t.Any, config: ConfigPaths, name: str) -> t.Callable[[str], t.Optional[str]]:
    """A persisted file's text as the run read it (``view``), for the resource ``name``."""
    return functools.partial(read_file, view, config, name)


def read_file(view: t.Any, config: ConfigPaths, name: str, path: str) -> t.Optional[str]:
    """A persisted file's text as the run read it."""
    what = {config.limits_json: 'the persisted limits of %s (a JSON file)', config.limits_file: 'the limit '
            'commands of %s (a file)', config.limits_env: 'the start environment of %s (a file)',
            config.env_file: 'the environment file of %s'}.get(path, 'a file of %s')
    return view.text(path, what % name)


def usable(gpus: t.Sequence[Gpu]) -> t.List[Gpu]:
    """What a daemon of this host could be given: every GPU not in MIG mode, and every MIG device."""
    return [gpu for gpu in all_devices(gpus) if not gpu.mig_enabled]


def daemon_scope(view: t.Any, paths: ResourcePaths, config: ConfigPaths, gpus: t.Sequence[Gpu], *,
                 planned: t.Optional[t.Sequence[Gpu]], create: bool) -> DaemonScope:
    """The daemon's GPUs in ordinal order, whether it runs, and its pid. ``planned``: the devices mps_host's plan gives
    the resource - when the daemon runs on others (a GPU move, a MIG instance re-created), it restarts on these: the limits
    are checked and persisted for them, not sent to the old daemon."""
    seen = view.resource(paths.name)
    liveness = seen.liveness
    if liveness.conflict:
        raise MpsError('the MPS control daemon for %s: %s' % (paths.name, liveness.conflict), pid=liveness.pid)
    record = seen.record
    scope = functools.partial(DaemonScope, liveness=liveness, record=record)
    reader = file_reader(view, config, paths.name)
    uuids: t.Optional[t.List[str]] = None
    runs_v3 = (record is not None and record.protocol == 3) or (
        record is None and liveness.running and liveness.pid is not None and view.protocols.get(liveness.pid) == 3)
    if runs_v3 and planned is not None:
        # MPS v3 runs there (its record says so, or - the record lost - its process) and mps_host switches the resource to
        # the legacy protocol: the daemon restarts (the protocol differs), so the legacy limits are persisted for the new
        # start, never sent to the v3 daemon. Whether it is the resource's own is read_daemon's to decide (refused if not).
        return scope(list(planned), running=False, pid=None, order_known=True, scope_known=True)
    if record is not None:
        uuids = list(record.devices)
    elif liveness.running and liveness.pid:
        uuids = view.answered(view.environ_uuids, liveness.pid, 'the environment of pid %s' % liveness.pid)
        if uuids is not None:
            uuids = [gpu.uuid for gpu in resolve_devices(uuids, gpus, param='CUDA_VISIBLE_DEVICES of the daemon')]
    elif not liveness.running:
        # Stopped, but systemd starts it again from its environment file (after a crash, at boot) and replays
        # the commands file for that device order: keep the file right for it.
        listed = parse_env(reader(config.env_file) or '').get('CUDA_VISIBLE_DEVICES')
        uuids = listed.split(',') if listed else None
    if planned is not None and uuids is not None and [gpu.uuid for gpu in planned] != list(uuids):
        return scope(list(planned), running=False, pid=None, order_known=True, scope_known=True)
    known = dict(order_known=uuids is not None, scope_known=uuids is not None or liveness.running)
    if uuids is None:
        if liveness.running:
            return scope(usable(gpus), running=True, pid=liveness.pid, **known)  # a daemon without CUDA_VISIBLE_DEVICES sees every GPU
        if read_persisted(config, reader) is None and not create:
            raise MpsError('name: resource %r has no daemon under %s and no persisted limits in %s; start it with '
                           'gpufleet.mps.mps_daemon first, or set create=true to persist limits for its first start'
                           % (paths.name, paths.root, config.config_dir))
        return scope(usable(gpus), running=False, pid=None, **known)
    by_uuid = {gpu.uuid: gpu for gpu in all_devices(gpus)}
    missing = [uuid for uuid in uuids if uuid not in by_uuid]
    if missing:
        raise DeviceSelectionError('the daemon of %r was started on %s, which NVML no longer reports%s' % (
            paths.name, ', '.join(missing), MIG_GONE if any(is_mig_uuid(uuid) for uuid in missing) else ''))
    return scope([by_uuid[uuid] for uuid in uuids], running=liveness.running, pid=liveness.pid, **known)


def static_running(view: t.Any, scope: DaemonScope) -> bool:
    """The daemon was started with -S: its start record says so - or, without one (``/run`` is empty after a boot, and
    systemd started it again with -S from the limits environment file), its arguments. Its partitions are then read
    with its limits. A host plan keeps what its observe stage read of the arguments."""
    if scope.record is not None:
        return scope.record.static_partitioning
    liveness = scope.liveness
    if not liveness.running or not liveness.pid:
        return False
    return bool(view.answered(view.static_args, liveness.pid, 'the arguments of pid %s' % liveness.pid))


def read_limits(view: t.Any, name: str,
                scope: DaemonScope) -> t.Tuple[t.Optional[float], t.Dict[int, t.Optional[str]], t.List[ServerLimits], t.Any]:
    """Defaults and every server's limits, as the run's one control batch of the daemon read them."""
    readout = view.answered(view.readouts, name, 'the limits of %s' % name)
    if readout[0] != (len(scope.gpus), scope.pid) or (static_running(view, scope) and readout[1].lspart_text is None):
        raise MpsError('internal error: the limits of %s were read for %s, not for %s' % (
            name, readout[0], (len(scope.gpus), scope.pid)))
    readout = readout[1]
    servers = [ServerLimits(server.pid, server.active_thread_percentage, dict(enumerate(server.pinned_device_mem_limit)))
               for server in readout.servers]
    return readout.default_percentage, dict(enumerate(readout.default_mem)), servers, readout
