# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Facts about a host's MPS setup: NVML, GPUs, every daemon under a root, its servers and limits.

Reads only: no file, process, GPU or daemon setting is ever changed.

Everything a daemon is asked goes through ONE control UI process. Which of its children are servers
is only known from ``get_server_list``, in the same batch, so each child is asked about as if it
were one; ``_control`` frames the replies so that the error texts a non-server gets (undocumented,
possibly empty) cannot shift them.
"""

from __future__ import annotations

import os
import typing as t
from dataclasses import dataclass

from ._protocol.framing import ControlClient
from ._protocol.commands import PRIORITY_NAMES
from ._protocol.state import state_commands
from ._supervisor.liveness import DaemonState, inspect, read_pid_file
from ._errors import DaemonTimeoutError, InvalidParameterError, MpsError, NvmlError
from ._gpus import ENUMERATION_WARNING, MPS_ENUMERATION_VAR, Gpu, Nvml, all_devices, is_mig_uuid
from ._io import untraversable_parents
from ._resource.record import StartRecord, read_record
from ._proc import child_pids, daemon_dev_shm, process_uid, started_static
from ._container import with_engine
from ._limits.model import Limits, slice_env
from ._limits.partitions import partitions_view
from ._limits.store import persisted_facts, read_persisted
from ._resource.layout import (
    DEFAULT_CONTAINER_ROOT,
    SHM_DIR,
    ResourcePaths,
    config_paths,
    container_view,
    resource_paths,
    validate_root,
)
from ._observe.scan import foreign_daemons, gpu_claims, scan_config, scan_resources
from ._observe.readout import Readout, limit_differences, parse_daemon_replies, partition_differences
from ._tmpfs import current_state

GATHER_CHOICES = ('gpus', 'daemons', 'servers')


# --- the whole host -----------------------------------------------------------------------------
def nvml_facts(nvml_factory: t.Callable[[], Nvml]) -> t.Tuple[t.Dict[str, t.Any], t.List[Gpu], bool]:
    """(nvml facts, GPUs, whether NVML_MPS_DEVICE_ENUMERATION was set). Never raises for a missing driver."""
    facts: t.Dict[str, t.Any] = {'available': False, 'error': None, 'driver_version': None, 'cuda_driver_version': None}
    gpus: t.List[Gpu] = []
    enumeration_set = MPS_ENUMERATION_VAR in os.environ
    nvml = nvml_factory()
    # A missing nvidia-ml-py is a broken interpreter, not a host without a GPU: callers tell the two apart.
    facts['python_binding'] = nvml.has_binding
    try:
        with nvml:
            facts['driver_version'] = nvml.driver_version()
            facts['cuda_driver_version'] = nvml.cuda_driver_version()
            gpus = list(nvml.gpus())
    except NvmlError as exc:
        facts['error'] = exc.msg
        return facts, [], enumeration_set or nvml.enumeration_var_was_set
    facts['available'] = True
    return facts, gpus, enumeration_set or nvml.enumeration_var_was_set


@dataclass
class InfoRequest:
    """The validated options of one mps_info run."""

    root: str
    config_dir: str
    name: t.Optional[str]
    gather: t.FrozenSet[str]
    control_binary: t.Optional[str]
    timeout: float
    container_root: str = DEFAULT_CONTAINER_ROOT
    # The container view's slice: the environment one of this many clients sets to take 1/slices of each GPU (None: none).
    slices: t.Optional[int] = None

    @classmethod
    def validate(cls, root: str, config_dir: str, name: t.Optional[str], gather: t.Sequence[str],
                 control_binary: t.Optional[str], timeout: float,
                 container_root: str = DEFAULT_CONTAINER_ROOT, slices: t.Optional[int] = None) -> 'InfoRequest':
        if not gather:
            raise InvalidParameterError('gather', 'must name at least one of %s' % ', '.join(GATHER_CHOICES))
        unknown = sorted(set(gather) - set(GATHER_CHOICES))
        if unknown:
            raise InvalidParameterError('gather', 'unknown %s; choose from %s' % (', '.join(unknown), ', '.join(GATHER_CHOICES)))
        if timeout <= 0:
            raise InvalidParameterError('timeout', 'must be a positive number of seconds, got %s' % timeout)
        root = validate_root(root)
        if name is not None:
            resource_paths(root, name)
        config_dir = validate_root(config_dir, 'config_dir')
        container_root = validate_root(container_root, 'container_root')
        if name is not None:
            container_view(resource_paths(root, name), container_root)
        wanted = frozenset(gather)
        if 'servers' in wanted:
            wanted = wanted | {'daemons'}
        if slices is not None:
            slice_env(slices, [])  # refused here, naming slices, before anything is read
        return cls(root, config_dir, name, wanted, control_binary, timeout, container_root, slices)


@dataclass
class Report:
    """The module's result, less ``changed``, and its warnings."""

    facts: t.Dict[str, t.Any]
    warnings: t.List[str]
    ui_processes: int = 0


class Collector:
    """Gathers the facts of one host; never changes anything."""

    def __init__(self, request: InfoRequest, nvml_factory: t.Callable[[], Nvml] = Nvml,
                 uid_of: t.Callable[[int], t.Optional[int]] = process_uid) -> None:
        self.request = request
        self.nvml_factory = nvml_factory
        self.uid_of = uid_of
        self.warnings: t.List[str] = []
        self.ui_processes = 0
        self._read: t.Optional[t.Tuple[t.Dict[str, DaemonState], t.Dict[str, t.Optional[StartRecord]]]] = None

    def collect(self) -> Report:
        nvml, gpus, enumeration_set = nvml_facts(self.nvml_factory)
        facts: t.Dict[str, t.Any] = {'nvml': nvml, 'control_binary': self.request.control_binary}
        if enumeration_set:
            self.warnings.append(ENUMERATION_WARNING)
        if 'daemons' in self.request.gather:
            facts['daemons'] = self.daemons(gpus, nvml['available'])
            facts['other_daemons'] = self.other_daemons(gpus)
        if 'gpus' in self.request.gather:
            facts['gpus'] = [gpu.facts() for gpu in gpus]
            self._mig_servers(facts['gpus'])
        facts['shm'] = self.shm()
        # Every resource this collection left something of, running or not: what a teardown must visit.
        facts['resources'] = sorted(set(scan_resources(self.request.root)) | set(scan_config(self.request.config_dir)))
        return Report(facts, self.warnings, self.ui_processes)

    def shm(self) -> t.Dict[str, t.Any]:
        """The shared tmpfs at <root>/shm, as the kernel reports it."""
        path = os.path.join(self.request.root, SHM_DIR)
        facts: t.Dict[str, t.Any] = {'path': path, 'mounted': False, 'size_kib': None, 'options': [], 'error': None}
        try:
            state = current_state(path)
        except MpsError as exc:
            facts.update(mounted=True, error=exc.msg)
            self.warnings.append(exc.msg)
            return facts
        facts.update(mounted=state.mounted, size_kib=state.size_kib, options=state.flags)
        return facts

    def _mig_servers(self, gpu_facts: t.List[t.Dict[str, t.Any]]) -> None:
        """Say which resource of the root, and which running daemon, serves each MIG device (null: none)."""
        migs = [mig for gpu in gpu_facts for mig in gpu['mig_devices']]
        if not migs:
            return
        serving: t.Dict[str, t.Tuple[str, t.Optional[int]]] = {}
        states, records = self._read_all(self._all_paths())
        for name, record in records.items():
            for uuid in record.devices if record else []:
                serving[uuid] = (name, states[name].pid if states[name].running else None)
        for mig in migs:
            mig['resource'], mig['daemon_pid'] = serving.get(mig['uuid'], (None, None))

    # --- daemons ---------------------------------------------------------------------------------
    def _read_all(self, everything: t.Sequence[ResourcePaths]) -> t.Tuple[t.Dict[str, DaemonState], t.Dict[str, t.Optional[StartRecord]]]:
        """Each resource's daemon state and start record, read once per run (daemons and the MIG facts both ask)."""
        if self._read is None:
            self._read = ({paths.name: inspect(paths) for paths in everything}, {paths.name: read_record(paths) for paths in everything})
        return self._read

    def _all_paths(self) -> t.List[ResourcePaths]:
        found = []
        for name in scan_resources(self.request.root):
            try:
                found.append(resource_paths(self.request.root, name))
            except InvalidParameterError:
                continue  # its control socket could not even be bound: no daemon can be there
        return found

    def other_daemons(self, gpus: t.Sequence[Gpu]) -> t.List[t.Dict[str, t.Any]]:
        """The MPS control daemons of the host not under the root (another root's, hand-started, the device plugin's), and
        the root's orphans."""
        by_uuid = {gpu.uuid: gpu for gpu in all_devices(gpus)}
        known, unreadable = foreign_daemons(None, gpus, outside=self.request.root)
        found = []
        for daemon in known + unreadable:
            found.append({'pid': daemon.pid, 'uid': daemon.uid, 'pipe_dir': daemon.pipe_dir, 'orphan': daemon.orphan,
                          'devices': [by_uuid[uuid].summary() for uuid in daemon.uuids if uuid in by_uuid]})
            if daemon.orphan:
                self.warnings.append('an MPS control daemon still serves %s: %s' % (
                    ', '.join(by_uuid[uuid].label for uuid in daemon.uuids if uuid in by_uuid) or 'GPUs', daemon.describe()))
            if daemon.pipe_dir is None:
                self.warnings.append('another MPS control daemon runs, %s; its GPUs cannot be told without root' % daemon.describe())
        return found

    def daemons(self, gpus: t.Sequence[Gpu], nvml_available: bool) -> t.List[t.Dict[str, t.Any]]:
        by_uuid = {gpu.uuid: gpu for gpu in all_devices(gpus)}
        everything = self._all_paths()
        if self.request.name is None:
            reported = everything
        else:
            reported = [resource_paths(self.request.root, self.request.name)]
        states, records = self._read_all(everything)
        daemons = []
        for paths in reported:
            if paths.name not in states:
                states[paths.name] = inspect(paths)
                records[paths.name] = read_record(paths)
            state = states[paths.name]
            if state.running or state.stale or state.conflict:
                daemons.append(self.daemon(paths, state, records[paths.name], by_uuid, nvml_available))
        self._warn_shared_gpus(states, records, {d['name'] for d in daemons}, by_uuid)
        return daemons

    def daemon(self, paths: ResourcePaths, state: DaemonState, found: t.Optional[StartRecord], by_uuid: t.Mapping[str, Gpu],
               nvml_available: bool) -> t.Dict[str, t.Any]:
        record = found or StartRecord()  # no record: no devices, and null for what only a record says
        uuids = list(record.devices)
        devices = []
        for ordinal, uuid in enumerate(uuids):
            gpu = by_uuid.get(uuid)
            device: t.Dict[str, t.Any] = {'ordinal': ordinal, 'uuid': uuid, 'index': gpu.index if gpu else None}
            mig = is_mig_uuid(uuid)
            if mig:
                device.update(mig=gpu.address if gpu else None, profile=getattr(gpu, 'profile', None))
            devices.append(device)
            if gpu is None and nvml_available and state.running:
                self.warnings.append(
                    '%s %s, which the MPS control daemon of %s was started on, is no longer reported by NVML%s' % (
                        'MIG device' if mig else 'GPU', uuid, paths.name,
                        ': its MIG instance was destroyed or re-created (new UUID); give the resource its new MIG device and '
                        'run gpufleet.mps.mps_daemon or mps_host again' if mig else ''))
        persisted = read_persisted(config_paths(self.request.config_dir, paths.name))
        facts: t.Dict[str, t.Any] = {
            'name': paths.name,
            'pipe_dir': paths.pipe_dir,
            'log_dir': paths.log_dir,
            'env': paths.client_env(),
            'state': state.label,
            'running': state.running,
            'healthy': False,
            'error': state.conflict,
            'pid': state.pid if state.running or state.conflict else None,
            'supervisor': record.supervisor,
            'multiuser': record.multiuser if found else None,
            'started_at': record.started_at,
            'driver_version': record.driver_version,
            'devices': devices,
            'leftovers': [] if state.running else list(state.leftovers),
            'limits': {'reported': None, 'persisted': persisted_facts(persisted), 'differences': []},
            'shm': record.shm,
            'container': None,
            # Started with -S (null without a record), and its partitions as lspart lists them (null: none read)
            'static_partitioning': record.static_partitioning if found else started_static(state.pid) if state.running and state.pid else None,
            'sm_partitions': None,
        }
        # What the daemon really sees beats the record, which /run loses at boot.
        seen = daemon_dev_shm(state.pid, paths.shm_dir) if state.running and state.pid else None
        if seen is not None:
            facts['shm'] = seen == paths.shm_dir
        try:
            facts['container'] = container_view(paths, self.request.container_root, facts['shm'])
        except InvalidParameterError as exc:
            self.warnings.append('no container view for %s: %s' % (paths.name, exc.msg))
        if facts['container'] is not None:
            if self.request.slices is not None:
                facts['container']['slice'] = self._slice(uuids, by_uuid, persisted)
            try:
                # the same view as a container engine's arguments (and a pod spec's), the slice's limits included
                with_engine(facts['container'], (facts['container'].get('slice') or {}).get('env'))
            except InvalidParameterError as exc:
                self.warnings.append('no container engine arguments for %s: %s' % (paths.name, exc.msg))
        if 'servers' in self.request.gather:
            facts['servers'] = []
        if state.conflict:
            self.warnings.append('the MPS control daemon of %s: %s' % (paths.name, state.conflict))
            return facts
        if not state.running:
            self.warnings.append('the MPS control daemon of %s%s is not running but left files behind (%s); '
                                 'gpufleet.mps.mps_daemon cleans them up' % (
                                     paths.name, _last_pid(paths), ', '.join(state.leftovers)))
            return facts
        self._warn_compute_modes(paths, devices, by_uuid, nvml_available)
        now = next((gpu.driver_version for gpu in by_uuid.values() if gpu.driver_version), None) if nvml_available else None
        if record.driver_version and now and record.driver_version != now:
            self.warnings.append('the MPS control daemon of %s was started under driver %s and NVML now reports %s: '
                                 'gpufleet.mps.mps_daemon or mps_host restarts it (its busy policy decides about clients)' % (
                                     paths.name, record.driver_version, now))
        if record.shm and state.pid and seen != paths.shm_dir:
            self.warnings.append('the MPS control daemon of %s (pid %d) was started with shm=true but does not see %s as its '
                                 '/dev/shm (remounted since it started?): container clients cannot reach its servers; '
                                 'gpufleet.mps.mps_daemon restarts it' % (paths.name, state.pid, paths.shm_dir))
        blocked = untraversable_parents(paths.pipe_dir)
        if blocked:
            self.warnings.append('%s cannot be traversed by other users: MPS clients of %s that do not run as root '
                                 'fail to connect (chmod o+x, or run clients as root)' % (', '.join(blocked), paths.name))
        self._ask(paths, state.pid, uuids, persisted, facts, bool(facts['static_partitioning']))
        return facts

    def _ask(self, paths: ResourcePaths, pid: t.Optional[int], uuids: t.Sequence[str], persisted: t.Optional[Limits],
             facts: t.Dict[str, t.Any], static: bool = False) -> None:
        """One UI process for everything the daemon can tell; a silent or broken daemon is reported, not raised."""
        candidates = child_pids(pid) if pid and 'servers' in self.request.gather else []
        readout, error = self._readout(paths, uuids, candidates, static)
        if readout is None:
            facts['error'] = error
            self.warnings.append('the MPS control daemon of %s (pid %s) runs but could not be asked: %s' % (
                paths.name, pid if pid else 'unknown', error))
            return
        mem = dict(zip(uuids, readout.default_mem))
        facts['healthy'] = True
        facts['limits']['reported'] = {'active_thread_percentage': readout.default_percentage, 'pinned_device_mem_limit': mem,
                                       'client_priority': PRIORITY_NAMES.get(readout.default_priority)}
        if 'servers' in facts:
            facts['servers'] = readout.servers
        differences = limit_differences(persisted, readout.default_percentage, mem, uuids, readout.default_priority)
        if static:
            facts['sm_partitions'] = partitions_view(readout.partitions)
            differences += partition_differences(persisted, readout.partitions, uuids)
            if facts['container'] is not None:  # what a client of the daemon sets to take one of them
                facts['container']['sm_partitions'] = [part['id'] for part in facts['sm_partitions'] or []]
        facts['limits']['differences'] = differences
        if differences:
            self.warnings.append('the limits of the MPS control daemon of %s differ from the persisted ones: %s' % (
                paths.name, '; '.join(differences)))

    def _readout(self, paths: ResourcePaths, uuids: t.Sequence[str], candidates: t.Sequence[int], static: bool = False
                 ) -> t.Tuple[t.Optional[Readout], t.Optional[str]]:
        """(what the daemon reported, None), or (None, why it could not be asked)."""
        if not self.request.control_binary:
            return None, 'nvidia-cuda-mps-control was not found on PATH: the daemon cannot be asked anything'
        client = ControlClient(self.request.control_binary, paths.pipe_dir, timeout=self.request.timeout, log_dir=paths.log_dir)
        try:
            try:
                replies = client.batch(state_commands(len(uuids), candidates, static))
            finally:
                self.ui_processes += client.processes
            return parse_daemon_replies(replies, len(uuids), candidates, uuids, self.uid_of, static), None
        except DaemonTimeoutError:
            return None, 'accepted the connection but did not answer within %ss (see %s)' % (
                _seconds(self.request.timeout), os.path.join(paths.log_dir, 'control.log'))
        except MpsError as exc:
            return None, exc.msg
        except UnicodeDecodeError as exc:
            return None, 'the control UI printed unreadable output (%s)' % exc

    def _slice(self, uuids: t.Sequence[str], by_uuid: t.Mapping[str, Gpu], persisted: t.Optional[Limits]) -> t.Dict[str, t.Any]:
        """One of ``slices`` clients' share of the daemon's GPUs, as the environment it sets (``slice_env``), capped by the
        persisted limits (what the daemon hands out); the memory only where NVML gave every GPU's size."""
        slices = int(self.request.slices or 1)
        gpus = [by_uuid.get(uuid) for uuid in uuids]
        memory = [gpu.memory_total_mib for gpu in gpus if gpu is not None] if all(gpus) and uuids else []
        return {'slices': slices, 'env': slice_env(
            slices, memory, persisted.active_thread_percentage if persisted else None,
            [persisted.mem_for(uuid) for uuid in uuids] if persisted else [],
            persisted.client_priority if persisted else None)}

    # --- warnings ----------------------------------------------------------------------------------
    def _warn_compute_modes(self, paths: ResourcePaths, devices: t.Sequence[t.Dict[str, t.Any]], by_uuid: t.Mapping[str, Gpu],
                            nvml_available: bool) -> None:
        if not nvml_available:
            return
        for device in devices:
            gpu = by_uuid.get(device['uuid'])
            if gpu is not None and not gpu.is_mig and gpu.compute_mode not in ('exclusive_process', 'unsupported'):
                self.warnings.append('GPU %d (%s) of the MPS control daemon of %s is in compute mode %s, not EXCLUSIVE_PROCESS: '
                                     'CUDA processes that bypass MPS can use it too' % (
                                         gpu.index, gpu.uuid, paths.name, gpu.compute_mode.upper()))

    def _warn_shared_gpus(self, states: t.Mapping[str, DaemonState], records: t.Mapping[str, t.Optional[StartRecord]],
                          reported: t.AbstractSet[str], by_uuid: t.Mapping[str, Gpu]) -> None:
        """A GPU in the records of two running daemons under the root (one of them reported here)."""
        live = {name: records[name] for name, state in states.items() if state.running or state.conflict}
        for uuid, names in sorted(gpu_claims({name: record for name, record in live.items() if record is not None}).items()):
            if len(names) > 1 and reported.intersection(names):
                gpu = by_uuid.get(uuid)
                self.warnings.append('%s is claimed by more than one MPS control daemon under %s: %s' % (
                    gpu.label if gpu else 'GPU %s' % uuid, self.request.root, ', '.join(sorted(names))))


def _last_pid(paths: ResourcePaths) -> str:
    pid = read_pid_file(paths.pipe_dir)
    return ' (pid %d)' % pid if pid else ''


def _seconds(value: float) -> str:
    return ('%d' % value) if float(value).is_integer() else ('%s' % value)
