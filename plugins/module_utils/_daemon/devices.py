# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A resource's devices: resolved and checked, who else serves them, and their compute modes."""

from __future__ import annotations

import typing as t

from .._errors import DeviceSelectionError, InvalidParameterError
from .._gpus import Gpu, all_devices, check_multiuser, is_mig_uuid
from .._observe.scan import ForeignDaemon, gpu_claims
from .._outcome import Outcome
from .._resource.record import StartRecord
from .._selectors import resolve_devices
from .decide import compute_mode_changes, releasable
from .model import DaemonOutcome, DaemonRun, Wanted


class DeviceChoice:
    """The GPUs a resource's daemon may take, and giving their compute modes back."""

    def __init__(self, run: DaemonRun) -> None:
        self.run = run
        self._foreign: t.Optional[t.Tuple[t.Dict[str, ForeignDaemon], t.List[ForeignDaemon]]] = None

    def owned_elsewhere(self) -> t.Dict[str, str]:
        """UUID -> resource, for GPUs of the other live daemons under the same root."""
        # The resources a host plan decides itself (ignore_owners) do not count.
        run = self.run
        others = run.view.live(run.host.ignore_owners | {run.paths.name})
        return {uuid: names[0] for uuid, names in gpu_claims({name: found[1] for name, found in others.items()}).items()}

    def foreign(self) -> t.Tuple[t.Dict[str, ForeignDaemon], t.List[ForeignDaemon]]:
        """(GPU UUID -> a daemon not of this root that serves it, daemons whose GPUs cannot be told).

        Daemons under the same root are told by their start records (:meth:`owned_elsewhere`, which names
        the resource); the processes show the others: under another root, started by hand, the device
        plugin's.
        """
        if self._foreign is None:
            # The view's one /proc scan: every daemon outside the root, and the root's orphans; this resource's own daemon
            # is under the root and named by its pid file, so it is among neither (a resource of this root is left to its
            # record: owned_elsewhere names the resource).
            known, unreadable = self.run.view.daemons
            claims: t.Dict[str, ForeignDaemon] = {}
            for daemon in known:
                if daemon.pid in self.run.host.ending_pids:
                    continue
                for uuid in daemon.uuids:
                    claims.setdefault(uuid, daemon)
            self._foreign = (claims, unreadable)
        return self._foreign

    def refuse_foreign(self, devices: t.Sequence[Gpu], out: Outcome) -> None:
        """Never take a GPU that an MPS daemon of another root, or of another tool, serves."""
        claims, unreadable = self.foreign()
        taken = [(gpu, claims[gpu.uuid]) for gpu in devices if gpu.uuid in claims]
        if taken:
            raise DeviceSelectionError(
                'devices: %s; one GPU served by two MPS control daemons breaks both (and stopping one resets the other\'s '
                'compute mode). Stop that daemon (echo quit | CUDA_MPS_PIPE_DIRECTORY=<its pipe directory> '
                'nvidia-cuda-mps-control) or choose other devices; nothing was done' % '; '.join(
                    '%s is served by another MPS control daemon: %s' % (gpu.label, daemon.describe())
                    for gpu, daemon in taken))
        for daemon in unreadable:
            out.warnings.append('another MPS control daemon runs, %s, and this run cannot read its environment to tell which '
                                'GPUs it serves (run as root): make sure it does not serve %s' % (
                                    daemon.describe(), ', '.join(gpu.label for gpu in devices)))

    def wanted(self, selectors: t.Any, *, multiuser: bool, compute_mode: str, enabled: bool, shm: bool = False,
               foreground: bool = False) -> Wanted:
        """Resolve and check the requested devices; raises before any side effect."""
        run = self.run
        devices = resolve_devices(selectors, run.view.gpus, warnings=run.planned.warnings)
        if compute_mode != 'unchanged' and any(gpu.is_mig for gpu in devices):
            # NVML refuses compute modes on MIG devices and on a GPU in MIG mode: MIG isolates the instance instead.
            run.planned.compute_mode_note = (
                '%s not applied: %s is a MIG device, and NVML has no compute mode for MIG devices (nor for a GPU in MIG mode); '
                'the instance is isolated by MIG instead' % (compute_mode.upper(), devices[0].label))
            compute_mode = 'unchanged'
        if multiuser:
            check_multiuser(devices)
        owners = self.owned_elsewhere()
        taken = [(gpu, owners[gpu.uuid]) for gpu in devices if gpu.uuid in owners]
        if taken:
            used = '; '.join('%s is already used by resource %r' % (gpu.label, owner) for gpu, owner in taken)
            raise DeviceSelectionError('devices: %s: a GPU belongs to one MPS daemon under %s; stop that resource or choose '
                                       'other devices' % (used, run.paths.root))
        if shm:
            self._check_shm()
        return Wanted(devices, multiuser, run.supervisor, compute_mode, enabled, shm, foreground)

    def _check_shm(self) -> None:
        """The shared tmpfs a daemon with shm=true needs: mounted (or mounted first by the same plan), and kept at boot."""
        # Imported here: only shm needs it (AnsiballZ compiles every module imported, on every run).
        from .._tmpfs import mounted_at, shm_persisted  # pylint: disable=import-outside-toplevel
        run = self.run
        view = run.view
        shm_dir = run.paths.shm_dir
        if not run.host.shm_planned and mounted_at(shm_dir, view.mounts(), view.realpath(shm_dir)) is None:
            message = ('%s does not exist or is not mounted: mount the shared tmpfs with gpufleet.mps.mps_shm before '
                       'starting daemons with shm=true' % shm_dir)
            if not run.check_mode:
                raise InvalidParameterError('shm', message)
            run.planned.warnings.append(message + ' (check mode carries on)')
        if run.supervisor == 'systemd' and not run.host.shm_planned and not shm_persisted(shm_dir, run.unit_dir, reader=view.text,
                                                                                          real=view.realpath(shm_dir)):
            run.planned.warnings.append(
                '%s is mounted but neither a mount unit nor an fstab line brings it back at boot: the unit %s needs it '
                '(RequiresMountsFor=, BindPaths=) and will fail to start after a reboot; mount it with '
                'gpufleet.mps.mps_shm persist=systemd' % (shm_dir, run.unit))

    def report_gone(self, record: t.Optional[StartRecord], wanted: t.Optional[Wanted], out: 'DaemonOutcome') -> None:
        """Name the devices the daemon was started on that NVML no longer reports: a MIG instance destroyed, or
        destroyed and created again with a new UUID (nvidia-mig-parted re-partitioning). Nothing is reset for them."""
        if record is None:
            return
        run = self.run
        known = {gpu.uuid for gpu in all_devices(run.view.gpus)}
        onto = wanted.devices if wanted is not None else []
        for uuid in record.devices:
            if uuid in known:
                continue
            if onto:
                then = 'The daemon restarts on %s.' % ', '.join(gpu.label for gpu in onto)
            elif run.planned.own_pid:
                then = 'The daemon is stopped; nothing is reset for the device.'
            else:
                then = 'Nothing is reset for it.'
            if is_mig_uuid(uuid):
                what = ('MIG device %s, which resource %r was started on, no longer exists: its instance was destroyed (or '
                        're-created by re-partitioning, with a new UUID), and clients of the daemon on it fail. %s%s' % (
                            uuid, run.paths.name, then, '' if onto else
                            ' To serve the new instance, list the resource with its MIG device (nvidia-smi -L lists them).'))
            else:
                what = 'GPU %s, which resource %r was started on, is no longer reported by NVML (removed, or fallen off the bus). %s' % (
                    uuid, run.paths.name, then)
            out.gone.append({'uuid': uuid, 'message': what})
            out.warnings.append(what)

    def set_compute_modes(self, devices: t.Sequence[Gpu], mode: str, out: Outcome) -> None:
        nvml = self.run.nvml
        for gpu in compute_mode_changes(devices, mode):
            change = out.act('set compute mode %s on GPU %d (%s)' % (mode.upper(), gpu.index, gpu.uuid),
                             lambda gpu=gpu: nvml.set_compute_mode(gpu, mode))
            change.undo = lambda gpu=gpu, was=gpu.compute_mode: nvml.set_compute_mode(gpu, was)

    def release_dropped(self, wanted: Wanted, record: t.Optional[StartRecord], out: Outcome) -> None:
        """After a restart on fewer GPUs, give the dropped ones back to non-MPS users."""
        if not record or record.compute_mode == 'unchanged':
            return
        dropped = set(record.devices) - {gpu.uuid for gpu in wanted.devices}
        self.set_compute_modes(self.releasable_gpus(dropped, out), 'default', out)

    def releasable_gpus(self, uuids: t.Set[str], out: Outcome) -> t.List[Gpu]:
        """The GPUs of ``uuids`` whose compute mode may go back to DEFAULT: no other MPS daemon serves them."""
        # Observed (the other resources' records, the /proc scan, NVML), then decided (.decide, no I/O).
        gpus, warnings = releasable(self.run.view.gpus, uuids, set(self.owned_elsewhere()), self.run.host.keep_modes, self.foreign()[0])
        out.warnings.extend(warnings)
        return gpus
