# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""mps_info's facts: a rendering of the run's view of the host (_observe.view.HostView), and nothing else.

:func:`render` is a pure function of the request, the NVML facts and the sealed view that :class:`._info.Collector`
read: GPUs, every daemon under the root with its servers and limits, the other daemons of the host and the root's
orphans, the shared tmpfs, the resources a teardown must visit, and the warnings a person should see.
"""

from __future__ import annotations

import os
import typing as t

from ._attribution import owner_counts
from ._container import with_engine
from ._errors import InvalidParameterError, MpsError
from ._gpus import ENUMERATION_WARNING, Gpu, all_devices, is_mig_uuid
from ._io import untraversable
from ._proc import replaced_binary_warning
from ._limits.model import Limits, check_replicas, slice_env
from ._limits.partitions import parse_lspart, partitions_view
from ._limits.store import persisted_facts, read_persisted
from ._observe.readout import limit_differences, partition_differences
from ._observe.scan import gpu_claims, scan_config, scan_resources
from ._protocol.commands import PRIORITY_NAMES
from ._resource.layout import SHM_DIR, ResourcePaths, config_paths, container_view
from ._resource.record import StartRecord
from ._tmpfs import current_state


def render(request: t.Any, view: t.Any, nvml: t.Dict[str, t.Any], *, enumeration_set: bool) -> t.Tuple[t.Dict[str, t.Any], t.List[str]]:
    """(facts, warnings) of one mps_info run, from its sealed view."""
    return Facts(request, view).render(nvml, enumeration_set=enumeration_set)


class Facts:
    """The facts of one host as its view shows them; never reads anything."""

    def __init__(self, request: t.Any, view: t.Any) -> None:
        self.request = request
        self.view = view
        self.warnings: t.List[str] = []

    def render(self, nvml: t.Dict[str, t.Any], *, enumeration_set: bool) -> t.Tuple[t.Dict[str, t.Any], t.List[str]]:
        gpus = self.view.gpus
        facts: t.Dict[str, t.Any] = {'nvml': nvml, 'control_binary': self.request.control_binary}
        if enumeration_set:
            self.warnings.append(ENUMERATION_WARNING)
        if nvml.get('driver_upgrade_pending'):
            self.warnings.append(str(nvml['error']))
        if 'daemons' in self.request.gather:
            facts['daemons'] = self.daemons(gpus, nvml_available=nvml['available'])
            facts['other_daemons'] = self.other_daemons(gpus)
        if 'gpus' in self.request.gather:
            facts['gpus'] = [gpu.facts() for gpu in gpus]
            self._mig_servers(facts['gpus'])
        facts['shm'] = self.shm()
        # Every resource this collection left something of, running or not: what a teardown must visit.
        facts['resources'] = sorted(set(scan_resources(self.view.paths, self.request.root))
                                    | set(scan_config(self.view.paths, self.request.config_dir)))
        return facts, self.warnings

    def shm(self) -> t.Dict[str, t.Any]:
        """The shared tmpfs at <root>/shm, as the kernel reported it."""
        path = os.path.join(self.request.root, SHM_DIR)
        facts: t.Dict[str, t.Any] = {'path': path, 'mounted': False, 'size_kib': None, 'options': [], 'error': None}
        try:
            state = current_state(path, mountinfo=self.view.mounts(), mode_of=self.view.mode, real=self.view.realpath(path))
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
        for name, seen in self.view.resources.items():
            record = self._record(seen)
            for uuid in record.devices if record else []:
                serving[uuid] = (name, seen.liveness.pid if seen.liveness.running else None)
        for mig in migs:
            mig['resource'], mig['daemon_pid'] = serving.get(mig['uuid'], (None, None))

    @staticmethod
    def _record(seen: t.Any) -> t.Optional[StartRecord]:
        return seen.record if seen.problem is None else None

    # --- daemons ---------------------------------------------------------------------------------
    def other_daemons(self, gpus: t.Sequence[Gpu]) -> t.List[t.Dict[str, t.Any]]:
        """The MPS control daemons of the host not under the root (another root's, hand-started, the device plugin's), and
        the root's orphans."""
        by_uuid = {gpu.uuid: gpu for gpu in all_devices(gpus)}
        known, unreadable = self.view.daemons
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

    def reported(self) -> t.List[str]:
        """The resources reported: the one named, or every one under the root."""
        if self.request.name is not None:
            return [self.request.name]
        return sorted(name for name in scan_resources(self.view.paths, self.request.root) if name in self.view.resources)

    def daemons(self, gpus: t.Sequence[Gpu], *, nvml_available: bool) -> t.List[t.Dict[str, t.Any]]:
        by_uuid = {gpu.uuid: gpu for gpu in all_devices(gpus)}
        daemons = []
        for name in self.reported():
            seen = self.view.resources.get(name)
            if seen is None:
                continue
            state = seen.liveness
            if state.running or state.stale or state.conflict:
                daemons.append(self.daemon(seen.paths, seen, by_uuid, nvml_available=nvml_available))
        self._warn_shared_gpus({d['name'] for d in daemons}, by_uuid)
        return daemons

    def daemon(self, paths: ResourcePaths, seen: t.Any, by_uuid: t.Mapping[str, Gpu], *, nvml_available: bool) -> t.Dict[str, t.Any]:
        state, found = seen.liveness, self._record(seen)
        view = self.view
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
        persisted = self._persisted(paths.name)
        running_pid = state.pid if state.running and state.pid else None
        facts: t.Dict[str, t.Any] = {
            'name': paths.name,
            'pipe_dir': paths.pipe_dir,
            'log_dir': paths.log_dir,
            'env': paths.client_env(),
            'state': state.label,
            'running': state.running,
            'healthy': False,
            'error': state.conflict or (seen.problem.msg if seen.problem is not None else None),
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
            'static_partitioning': record.static_partitioning if found else view.static_args.get(running_pid) if running_pid else None,
            # The MPS protocol the running daemon was started with (2 legacy, 3 MPS v3; null: not running or unreadable)
            'protocol': view.protocols.get(running_pid) if running_pid else None,
            # The daemon's program was replaced or removed after it started (a driver package upgrade): null when unknown
            'binary_replaced': None if not running_pid or view.replaced.get(running_pid) is None else bool(view.replaced[running_pid]),
            'sm_partitions': None,
        }
        if seen.corrupt:
            self.warnings.append('the start record %s of %s is corrupt (%s)' % (paths.started_file, paths.name, seen.corrupt))
        # What the daemon really sees beats the record, which /run loses at boot.
        sees = view.dev_shm.get(running_pid) if running_pid else None
        if sees is not None:
            facts['shm'] = sees == paths.shm_dir
        self._container(paths, facts, uuids, by_uuid, persisted)
        if 'servers' in self.request.gather:
            facts['servers'] = []
        if state.conflict:
            self.warnings.append('the MPS control daemon of %s: %s' % (paths.name, state.conflict))
            return facts
        if not state.running:
            self.warnings.append('the MPS control daemon of %s%s is not running but left files behind (%s); '
                                 'gpufleet.mps.mps_daemon cleans them up' % (
                                     paths.name, ' (pid %d)' % state.pid_file_pid if state.pid_file_pid else '',
                                     ', '.join(state.leftovers)))
            return facts
        self._warn_running(paths, devices, record, by_uuid, nvml_available=nvml_available, pid=state.pid, sees=sees)
        if view.replaced.get(running_pid):
            self.warnings.append(replaced_binary_warning(paths.name, running_pid, view.replaced[running_pid]))
        self._reported(paths, uuids, persisted, facts, static=bool(facts['static_partitioning']))
        return facts

    def _persisted(self, name: str) -> t.Optional[Limits]:
        config = config_paths(self.request.config_dir, name)
        try:
            return read_persisted(config, self.view.text)
        except MpsError as exc:
            self.warnings.append(exc.msg)
            return None

    def _container(self, paths: ResourcePaths, facts: t.Dict[str, t.Any], uuids: t.Sequence[str], by_uuid: t.Mapping[str, Gpu],
                   persisted: t.Optional[Limits]) -> None:
        try:
            facts['container'] = container_view(paths, self.request.container_root, shm=facts['shm'])
        except InvalidParameterError as exc:
            self.warnings.append('no container view for %s: %s' % (paths.name, exc.msg))
        if facts['container'] is None:
            return
        if self.request.slices is not None:
            facts['container']['slice'] = self._slice(uuids, by_uuid, persisted)
        try:
            # the same view as a container engine's arguments (and a pod spec's), the slice's limits included
            with_engine(facts['container'], (facts['container'].get('slice') or {}).get('env'))
        except InvalidParameterError as exc:
            self.warnings.append('no container engine arguments for %s: %s' % (paths.name, exc.msg))

    def _warn_running(self, paths: ResourcePaths, devices: t.Sequence[t.Dict[str, t.Any]], record: StartRecord,
                      by_uuid: t.Mapping[str, Gpu], *, nvml_available: bool, pid: t.Optional[int], sees: t.Optional[str]) -> None:
        self._warn_compute_modes(paths, devices, by_uuid, nvml_available=nvml_available)
        now = next((gpu.driver_version for gpu in by_uuid.values() if gpu.driver_version), None) if nvml_available else None
        if record.driver_version and now and record.driver_version != now:
            self.warnings.append('the MPS control daemon of %s was started under driver %s and NVML now reports %s: '
                                 'gpufleet.mps.mps_daemon or mps_host restarts it (its busy policy decides about clients)' % (
                                     paths.name, record.driver_version, now))
        if record.shm and pid and sees != paths.shm_dir:
            self.warnings.append('the MPS control daemon of %s (pid %d) was started with shm=true but does not see %s as its '
                                 '/dev/shm (remounted since it started?): container clients cannot reach its servers; '
                                 'gpufleet.mps.mps_daemon restarts it' % (paths.name, pid, paths.shm_dir))
        blocked = untraversable(self.view.paths, paths.pipe_dir)
        if blocked:
            self.warnings.append('%s cannot be traversed by other users: MPS clients of %s that do not run as root '
                                 'fail to connect (chmod o+x, or run clients as root)' % (', '.join(blocked), paths.name))

    def _reported(self, paths: ResourcePaths, uuids: t.Sequence[str], persisted: t.Optional[Limits], facts: t.Dict[str, t.Any],
                  *, static: bool = False) -> None:
        """What the daemon answered in its one control batch; a silent or broken daemon is reported, not raised."""
        failure = self.view.failures.get(paths.name)
        readout = self.view.readouts.get(paths.name)
        v3 = self.view.v3.get(paths.name)
        if failure is None and v3 is not None:
            self._reported_v3(paths, v3[1], facts)
            return
        if failure is not None or readout is None:
            facts['error'] = failure or 'not asked'
            self.warnings.append('the MPS control daemon of %s (pid %s) runs but could not be asked: %s' % (
                paths.name, facts['pid'] if facts['pid'] else 'unknown', facts['error']))
            return
        state = readout[1]
        mem = dict(zip(uuids, state.default_mem))
        facts['healthy'] = True
        facts['limits']['reported'] = {'active_thread_percentage': state.default_percentage, 'pinned_device_mem_limit': mem,
                                       'client_priority': PRIORITY_NAMES.get(state.default_priority)}
        if 'servers' in facts:
            facts['servers'] = [{
                'pid': server.pid, 'status': server.status, 'uid': self.view.uids.get(server.pid), 'clients': server.clients,
                'client_owners': [self.view.owners.get(pid) or {'pid': pid, 'owner': 'unknown'} for pid in server.clients],
                'limits': {'active_thread_percentage': server.active_thread_percentage,
                           'pinned_device_mem_limit': dict(zip(uuids, server.pinned_device_mem_limit))},
            } for server in state.servers]
            facts['clients_by_owner'] = owner_counts(owner for server in facts['servers'] for owner in server['client_owners'])
        differences = limit_differences(persisted, state.default_percentage, mem, uuids, state.default_priority)
        if static:
            partitions = parse_lspart(state.lspart_text, uuids) if state.lspart_text is not None else None
            facts['sm_partitions'] = partitions_view(partitions)
            differences += partition_differences(persisted, partitions, uuids)
            if facts['container'] is not None:  # what a client of the daemon sets to take one of them
                facts['container']['sm_partitions'] = [part['id'] for part in facts['sm_partitions'] or []]
        facts['limits']['differences'] = differences
        if differences:
            self.warnings.append('the limits of the MPS control daemon of %s differ from the persisted ones: %s' % (
                paths.name, '; '.join(differences)))

    def _reported_v3(self, paths: ResourcePaths, readout: t.Any, facts: t.Dict[str, t.Any]) -> None:
        """A v3 daemon (started by mps_host from a protocol: 3 entry): its server, its namespaces' limits as it lists them,
        its clients with their namespace and owner (issue 43)."""
        facts['healthy'] = readout.ready
        clients = [dict(self.view.owners.get(pid) or {'pid': pid, 'owner': 'unknown'}, namespace=namespace)
                   for pid, namespace in readout.clients]
        facts['v3'] = {'server': readout.server, 'listed': readout.found, 'status': readout.status or None,
                       'pipe_directory': os.path.join(paths.pipe_dir, readout.server),
                       'namespaces': {name: limits.as_dict() for name, limits in readout.namespaces.items()},
                       'clients': clients}
        if 'servers' in facts:
            facts['clients_by_owner'] = owner_counts(clients)
        if not readout.ready:
            state = 'not Ready (%s)' % readout.status if readout.found else 'not in its lists'
            facts['error'] = 'its MPS v3 server %s is %s' % (readout.server, state)
            self.warnings.append('the MPS v3 control daemon of %s (pid %s) runs, but %s%s' % (
                paths.name, facts['pid'], facts['error'], '' if readout.found else ': gpufleet.mps.mps_host starts it again'))

    def _slice(self, uuids: t.Sequence[str], by_uuid: t.Mapping[str, Gpu], persisted: t.Optional[Limits]) -> t.Dict[str, t.Any]:
        """One of ``slices`` clients' share of the daemon's GPUs, as the environment it sets (``slice_env``), capped by the
        persisted limits (what the daemon hands out); the memory only where NVML gave every GPU's size."""
        slices = int(self.request.slices or 1)
        gpus = [by_uuid.get(uuid) for uuid in uuids]
        # One client per slice: no more than each of the daemon's GPUs takes, as replicas (the one check of both).
        check_replicas(slices, [gpu for gpu in gpus if gpu is not None], 'slices')
        memory = [gpu.memory_total_mib for gpu in gpus if gpu is not None] if all(gpus) and uuids else []
        return {'slices': slices, 'env': slice_env(
            slices, memory, persisted.active_thread_percentage if persisted else None,
            [persisted.mem_for(uuid) for uuid in uuids] if persisted else [],
            persisted.client_priority if persisted else None)}

    # --- warnings ----------------------------------------------------------------------------------
    def _warn_compute_modes(self, paths: ResourcePaths, devices: t.Sequence[t.Dict[str, t.Any]], by_uuid: t.Mapping[str, Gpu],
                            *, nvml_available: bool) -> None:
        if not nvml_available:
            return
        for device in devices:
            gpu = by_uuid.get(device['uuid'])
            if gpu is not None and not gpu.is_mig and gpu.compute_mode not in ('exclusive_process', 'unsupported'):
                self.warnings.append('GPU %d (%s) of the MPS control daemon of %s is in compute mode %s, not EXCLUSIVE_PROCESS: '
                                     'CUDA processes that bypass MPS can use it too' % (
                                         gpu.index, gpu.uuid, paths.name, gpu.compute_mode.upper()))

    def _warn_shared_gpus(self, reported: t.AbstractSet[str], by_uuid: t.Mapping[str, Gpu]) -> None:
        """A GPU in the records of two running daemons under the root (one of them reported here)."""
        for uuid, names in sorted(gpu_claims({name: found[1] for name, found in self.view.live().items()}).items()):
            if len(names) > 1 and reported.intersection(names):
                gpu = by_uuid.get(uuid)
                self.warnings.append('%s is claimed by more than one MPS control daemon under %s: %s' % (
                    gpu.label if gpu else 'GPU %s' % uuid, self.request.root, ', '.join(sorted(names))))
