# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bring a resource's MPS limits to the wanted values: compute, compare, apply, persist.

One UI process reads everything (defaults, the server list, every server's own limits); at most one
more applies the differences. The persisted record is the truth for what was set - the daemon's
memory read-back is lossy (``3840M`` reads ``3G``) - and the read-back detects drift, for example
after a restart that nobody replayed the limits for.
"""

from __future__ import annotations

import dataclasses
import typing as t
from dataclasses import dataclass, field

from .._options import RUNNING_SERVERS_CHOICES
from .._errors import DeviceSelectionError, InvalidParameterError, MpsError
from .._outcome import Outcome
from .._protocol.commands import PRIORITY_NAMES, check_applied
from .._supervisor.liveness import DaemonState
from .._supervisor.process import Daemon
from .._gpus import Gpu, all_devices, is_mig_uuid
from .._io import atomic_write, ensure_dir, refuse_unsafe_dirs, remove, restorer
from .model import (
    check_fits,
    check_shares_fit,
    check_replicas,
    EVERY_GPU,
    Limits,
    less_than_one_sm,
    parse_mem_limit,
    parse_percentage as parse_wanted_percentage,
    parse_priority,
    replica_limits,
    replica_warnings,
)
from .decide import LimitsSeen, decide_limits
from .observe import LimitsObserve
from .partition_plan import PartitionPlan
from .partitions import check_partition_gpus, parse_partitions, partitions_view
from .priority import PriorityCheck
from .store import persist, read_persisted, rendered, write_replay
from .._resource.layout import ConfigPaths, ResourcePaths, managed_dirs
from .._selectors import resolve_devices
from .._supervisor.unit import parse_env

# Said of a recorded MIG device that NVML no longer reports.
MIG_GONE = (': the MIG instance was destroyed (and perhaps created again, with a new UUID - nvidia-smi -L lists the current '
            'ones); start the resource on its new MIG device first (gpufleet.mps.mps_daemon, or mps_host and the fleet role, '
            'which do both in one run), then set its limits')


@dataclass
class LimitsOutcome(Outcome):
    applied: bool = False
    persisted: bool = False
    running: bool = False
    msg: str = ''
    commands: t.List[str] = field(default_factory=list)
    limits: t.Dict[str, t.Any] = field(default_factory=dict)
    pending: t.List[t.Dict[str, t.Any]] = field(default_factory=list)
    ui_processes: int = 0
    # Why the running daemon must restart for the wanted limits (exact mode: a pinned memory limit to remove,
    # which MPS has no command for); empty when it need not.
    restart_needed: str = ''
    # The limits the plan persists (exact mode: none persisted when empty).
    wanted: t.Optional[Limits] = None
    # The device order the plan keeps the commands file in (None: unknown, the daemon's first start writes it).
    replay_for: t.Optional[t.List[str]] = None
    # The daemon's static SM partitions as lspart listed them (None: it runs without -S, or is not running).
    sm_partitions: t.Optional[t.List[t.Dict[str, t.Any]]] = None
    # What was said of the running daemon's answers and servers (a restart makes it moot).
    running_warnings: t.List[str] = field(default_factory=list)

    def restarted(self) -> 'LimitsOutcome':
        """The same decision for a daemon the plan restarts: nothing is sent to the old daemon - its start replays the
        persisted limits - and everything else stands."""
        sent = [change for change in self.changes if change.kind == 'limits']
        out = dataclasses.replace(self, changes=[change for change in self.changes if change not in sent],
                                  steps=[(change, run) for change, run in self.steps if change not in sent],
                                  actions=[change.text for change in self.changes if change not in sent],
                                  warnings=[warning for warning in self.warnings if warning not in self.running_warnings],
                                  commands=[], applied=False, pending=[], executed=[])
        out.changed = bool(out.changes)
        return out


class LimitsManager(LimitsObserve, PriorityCheck, PartitionPlan):
    """Limits of one resource."""

    def __init__(self, paths: ResourcePaths, config: ConfigPaths, daemon: t.Optional[Daemon], gpus: t.Sequence[Gpu], *,
                 check_mode: bool, view: t.Optional[t.Any] = None, oversubscribe: bool = False,
                 client_priority: t.Any = None, sm_partitions: t.Any = None, missing_binary: t.Optional[MpsError] = None,
                 entry: t.Any = None, prober: t.Optional[Daemon] = None) -> None:
        """``entry``: mps_host's resource entry (_host.plan.ResourcePlan) - the limits are then exact (declarative) and
        its own options win; ``prober``: the daemon whose binary's help is read where none runs (mps_host: the
        resource's own, before its start)."""
        self.paths = paths
        self.config = config
        self.daemon = daemon
        self.gpus = list(gpus)
        self.check_mode = check_mode
        # The run's one view of the host (_observe.view.HostView): every decision here reads it (ensure() reads its own).
        self.view = view
        self.order_known = False
        # Whether the daemon's GPUs are known: it runs, or was started (its record), or its environment file
        # names them. Not before the first start of a new resource - the role's order.
        self.scope_known = False
        self.state: t.Optional[DaemonState] = None
        self.record: t.Any = None  # the daemon's start record, read with its state
        # Exact (declarative) limits, as mps_host manages them: what is not given is not wanted - no inheritance from
        # the persisted record, a thread percentage not given is 100, a memory limit not given is none.
        self.exact = False
        # mps_host: the devices the plan gives the resource. When the daemon runs on others (a GPU move, a MIG instance
        # re-created), it restarts on these: the limits are checked and persisted for them, not sent to the old daemon.
        self.planned: t.Optional[t.List[Gpu]] = None
        # mps_host: the same plan starts the daemon (every listed resource runs after it): a daemon found dead is
        # recovered there and its limits replayed, so its absence now is no warning of the limits' own.
        self.start_follows = False
        # Whether replicas times an explicit pinned limit may exceed a GPU's memory (mps_limits oversubscribe).
        self.oversubscribe = oversubscribe
        # The default client priority wanted (mps_limits client_priority, a resources entry's): as given, None: not given.
        self.client_priority: t.Any = client_priority
        # The static SM partitions wanted on each GPU (mps_limits sm_partitions, a resources entry's): chunk counts; None: not given.
        self.sm_partitions: t.Any = sm_partitions
        # Whose binary's help says whether it has client priority, where no running daemon answered (mps_host gives the
        # resource's daemon even when it is not running yet); None: self.daemon.
        self.prober: t.Optional[Daemon] = prober
        # Why there is no daemon to talk to (mps_limits without a usable control binary): said when one runs.
        self.missing_binary: t.Optional[MpsError] = missing_binary
        # mps_host's entry (_host.plan.ResourcePlan), its values checked and parsed once, by the plan.
        self.entry = entry
        if entry is not None:
            # mps_host's entry: exact limits, its options, its planned devices; the same plan starts the daemon.
            self.exact = True
            self.oversubscribe = entry.oversubscribe
            self.client_priority = entry.client_priority
            self.sm_partitions = entry.sm_partitions
            self.planned = list(entry.devices)
            self.start_follows = True

    # --- what the daemon has ----------------------------------------------------------------------
    def scope(self, *, create: bool) -> t.Tuple[t.List[Gpu], bool, t.Optional[int]]:
        """The daemon's GPUs in ordinal order, whether it runs, and its pid."""
        seen = self.view.resource(self.paths.name)
        state = self.state = seen.state
        if state.conflict:
            raise MpsError('the MPS control daemon for %s: %s' % (self.paths.name, state.conflict), pid=state.pid)
        record = self.record = seen.record
        uuids: t.Optional[t.List[str]] = None
        if record is not None:
            uuids = list(record.devices)
        elif state.running and state.pid:
            uuids = self.view.answered(self.view.environ_uuids, state.pid, 'the environment of pid %s' % state.pid)
            if uuids is not None:
                uuids = [gpu.uuid for gpu in resolve_devices(uuids, self.gpus, param='CUDA_VISIBLE_DEVICES of the daemon')]
        elif not state.running:
            # Stopped, but systemd starts it again from its environment file (after a crash, at boot) and replays
            # the commands file for that device order: keep the file right for it.
            listed = parse_env(self.read_file(self.config.env_file) or '').get('CUDA_VISIBLE_DEVICES')
            uuids = listed.split(',') if listed else None
        if self.exact and self.planned is not None and uuids is not None and [gpu.uuid for gpu in self.planned] != list(uuids):
            self.order_known = self.scope_known = True
            return list(self.planned), False, None
        # The device order the commands file must follow is known (else the next start writes it).
        self.order_known = uuids is not None
        self.scope_known = uuids is not None or state.running
        if uuids is None:
            if state.running:
                return self._usable(), True, state.pid  # a daemon without CUDA_VISIBLE_DEVICES sees every GPU
            if read_persisted(self.config, self.read_file) is None and not create:
                raise MpsError('name: resource %r has no daemon under %s and no persisted limits in %s; start it with '
                               'gpufleet.mps.mps_daemon first, or set create=true to persist limits for its first start'
                               % (self.paths.name, self.paths.root, self.config.config_dir))
            return self._usable(), False, None
        by_uuid = {gpu.uuid: gpu for gpu in all_devices(self.gpus)}
        missing = [uuid for uuid in uuids if uuid not in by_uuid]
        if missing:
            raise DeviceSelectionError('the daemon of %r was started on %s, which NVML no longer reports%s' % (
                self.paths.name, ', '.join(missing), MIG_GONE if any(is_mig_uuid(uuid) for uuid in missing) else ''))
        return [by_uuid[uuid] for uuid in uuids], state.running, state.pid

    def read_file(self, path: str) -> t.Optional[str]:
        """A persisted file's text as the run read it."""
        what = {self.config.limits_json: 'the persisted limits of %s (a JSON file)', self.config.limits_file: 'the limit '
                'commands of %s (a file)', self.config.limits_env: 'the start environment of %s (a file)',
                self.config.env_file: 'the environment file of %s'}.get(path, 'a file of %s')
        return self.view.text(path, what % self.paths.name)

    def _usable(self) -> t.List[Gpu]:
        """What a daemon of this host could be given: every GPU not in MIG mode, and every MIG device."""
        return [gpu for gpu in all_devices(self.gpus) if not gpu.mig_enabled]

    # --- what is wanted ---------------------------------------------------------------------------
    def wanted(self, scope: t.Sequence[Gpu], percentage: t.Any, mem: t.Any, replicas: t.Any) -> Limits:
        """The limits wanted, every value checked against the daemon's GPUs (``scope``).

        Before the first start of a new resource its GPUs are not known yet (``scope`` is every GPU of the host):
        what is meant for every GPU of the daemon - one size, a replica count - is then refused only when no GPU
        of the host could take it, so that a limit meant for the large GPUs of a mixed host is not refused for the
        small ones of another resource. The fleet role's pre-flight checks it against the resource's own GPUs.
        """
        if self.entry is not None:
            return self.entry.wanted_limits()  # mps_host: exact, checked once by its plan
        # what is not given keeps its persisted value (mps_limits)
        previous = read_persisted(self.config, self.read_file) or Limits()
        limits = Limits(previous.active_thread_percentage, dict(previous.pinned_device_mem_limit), previous.replicas,
                        previous.client_priority, previous.sm_partitions)
        unknown = not self.scope_known and bool(scope)
        if replicas is not None:
            # The count as a number from here on ("4" from a template is 4; anything else is refused here).
            replicas = limits.replicas = check_replicas(replicas, [max(scope, key=lambda gpu: gpu.max_mps_clients)] if unknown
                                                        else scope)
            # The resource's own GPUs where they are known (its daemon's); before its first start, every GPU it could be
            # given - its start keeps those of its own (add_replica_shares, own_shares).
            own = scope if self.scope_known else self._usable()
            limits.active_thread_percentage, limits.pinned_device_mem_limit = replica_limits(replicas, own)
        if percentage is not None:
            limits.active_thread_percentage = parse_wanted_percentage(percentage)
        if self.client_priority is not None:
            limits.client_priority = parse_priority(self.client_priority)
        if self.sm_partitions is not None:
            limits.sm_partitions = parse_partitions(self.sm_partitions)
            check_partition_gpus(limits.sm_partitions, scope if self.scope_known else [])
        if mem is not None:
            param = 'pinned_device_mem_limit'
            limits.pinned_device_mem_limit = parse_mem_limit(mem, self.gpus, scope, param)
            largest = [max(scope, key=lambda gpu: gpu.memory_total_mib)] if scope else []
            checked = largest if EVERY_GPU in limits.pinned_device_mem_limit and unknown else scope
            check_fits(limits.pinned_device_mem_limit, checked, param)  # a GPU named in a mapping: its own size, always
            if replicas is not None and not self.oversubscribe:
                check_shares_fit(limits.pinned_device_mem_limit, replicas, checked, param)
        return limits

    # --- read, compare, apply ---------------------------------------------------------------------
    def plan(self, percentage: t.Any, mem: t.Any, replicas: t.Any, running_servers: str) -> LimitsOutcome:
        """Every change to the limits (persisted, sent to the running daemon), unapplied: mps_host executes a host's plan."""
        self._check(percentage, mem, replicas, running_servers)
        return self._plan(percentage, mem, replicas, running_servers, persist_limits=True, create=True)

    def _check(self, percentage: t.Any, mem: t.Any, replicas: t.Any, running_servers: str) -> None:
        if running_servers not in RUNNING_SERVERS_CHOICES:
            raise InvalidParameterError('running_servers', 'must be one of %s' % ', '.join(RUNNING_SERVERS_CHOICES))
        if (percentage is None and mem is None and replicas is None and self.client_priority is None and self.sm_partitions is None
                and not self.exact):
            raise InvalidParameterError('active_thread_percentage', 'give at least one of active_thread_percentage, '
                                        'pinned_device_mem_limit, replicas, client_priority or sm_partitions')

    def _plan(self, percentage: t.Any, mem: t.Any, replicas: t.Any, running_servers: str, *, persist_limits: bool,
              create: bool) -> LimitsOutcome:
        """Plan every action from the view (the daemon's one control batch, the record); nothing is read or changed here."""
        refuse_unsafe_dirs(managed_dirs(self.paths, self.config.config_dir), self.view.paths)
        scope, running, pid = self.scope(create=create)
        wanted = self.wanted(scope, percentage, mem, replicas)
        persisted = read_persisted(self.config, self.read_file)
        out = LimitsOutcome(running=running, wanted=wanted)
        out.limits = self._describe(wanted, scope)
        if replicas is not None and (self.planned is not None or self.scope_known):
            out.warnings += replica_warnings(wanted.replicas, self.planned if self.planned is not None else scope)
        if not self.exact and self.scope_known and (percentage is not None or replicas is not None):
            # mps_limits; mps_host's plan says it once for the whole host (_host/plan.py).
            out.warnings += less_than_one_sm(wanted.active_thread_percentage, scope,
                                             'active_thread_percentage' if percentage is not None else 'replicas')
        # Observed (one UI process for a running daemon), then decided by a pure function of it.
        if running:
            pct, mem_read, servers, readout = self.read(scope, pid)
            seen = LimitsSeen(persisted, True, pct, mem_read, tuple(servers), readout.default_priority, readout.priority_text)
        else:
            seen = LimitsSeen(persisted)
        self._check_priority_offered(wanted, seen)
        decision = decide_limits(wanted, [gpu.uuid for gpu in scope], seen, self.exact, running_servers, self.paths.name)
        out.sm_partitions = partitions_view(self._plan_partitions(wanted, persisted, [gpu.uuid for gpu in scope], running,
                                                                  readout if running else None, decision))
        out.before, out.after = decision.before, decision.after
        out.warnings += decision.warnings
        out.running_warnings = list(decision.warnings)
        if running:
            out.commands = decision.commands
            out.restart_needed = '; '.join(decision.restart_reasons)
            if out.restart_needed and not self.exact:
                out.warnings.append('%s; the limits are persisted, and a restart of its daemon applies them '
                                    '(gpufleet.mps.mps_daemon state=restarted)' % out.restart_needed)
            out.pending = [server.as_dict() for server in decision.pending]
            if out.commands:
                commands = list(out.commands)
                out.act('apply %s' % '; '.join(commands), lambda: self._apply(commands))
                out.applied = True
        else:
            out.msg = self._not_running(persist_limits, out.warnings)
        if persist_limits and self.exact and wanted.empty:
            self._forget(out)
        elif persist_limits:
            uuids = [g.uuid for g in scope]
            out.replay_for = uuids if self.order_known else None
            if persist(self.config, wanted, check_mode=True, reader=self.read_file):
                change = out.act('write %s' % self.config.limits_json, lambda: (
                    ensure_dir(self.config.config_dir, 0o755), persist(self.config, wanted, check_mode=False)))
                change.undo = restorer(self.config.limits_json, self._observed(self.config.limits_json))
                out.persisted = True
            if self.order_known:
                if write_replay(self.config, wanted, uuids, check_mode=True, reader=self.read_file):
                    change = out.act('write %s' % self.config.limits_file, lambda: (
                        ensure_dir(self.config.config_dir, 0o755), write_replay(self.config, wanted, uuids, check_mode=False)))
                    change.undo = self._undo_rendered()
                    out.persisted = True
            else:
                # The files rendered from the record at every write, so that none goes stale: without a known device order
                # the commands file goes (the next start writes it for its order), the start environment is rendered.
                for path, text in rendered(self.config, wanted, None):
                    if (self.read_file(path) or '') == text:
                        continue
                    change = out.act('%s %s' % ('write' if text else 'remove', path), self._writer(path, text),
                                     'the device order of its next start is not known: that start writes it'
                                     if path == self.config.limits_file else '')
                    change.undo = restorer(path, self._observed(path))
                    out.persisted = True
        elif not running:
            out.warnings.append('record=false and no daemon is running: nothing was done')
        if running:
            out.msg = ('%s %d command(s) to the running MPS control daemon of %r' % (
                'would send' if self.check_mode else 'sent', len(out.commands), self.paths.name) if out.commands else
                'the running MPS control daemon of %r already has these limits' % self.paths.name)
            if out.pending:
                out.msg += '; %d running server(s) keep other limits until they restart (pending)' % len(out.pending)
        out.ui_processes = self.daemon.client.processes if self.daemon else 0
        return out

    def _undo_rendered(self) -> t.Callable[[], None]:
        """Puts both rendered files back as the run read them."""
        undo = [restorer(path, self._observed(path)) for path in (self.config.limits_file, self.config.limits_env)]
        return lambda: [step() for step in undo] and None

    def _writer(self, path: str, text: str) -> t.Callable[[], None]:
        def write() -> None:
            if text:
                ensure_dir(self.config.config_dir, 0o755)
                atomic_write(path, text, 0o644)
            else:
                remove(path)
        return write

    def _observed(self, path: str) -> t.Tuple[t.Optional[str], t.Optional[int]]:
        """The file (its text and mode) as the run read it: what an undo puts back."""
        return self.read_file(path), self.view.mode(path)

    def _forget(self, out: LimitsOutcome) -> None:
        """Exact mode without limits: the persisted files go, so that no start replays old limits."""
        for path in (self.config.limits_json, self.config.limits_file, self.config.limits_env):
            if self.read_file(path) is not None:
                out.act('remove %s' % path, lambda path=path: remove(path), 'the resource has no limits')
                out.persisted = True

    def _not_running(self, persist_limits: bool, warnings: t.List[str]) -> str:
        """Why nothing was applied to a daemon; a warning only when one was expected to run.

        Persisting before the first start is the normal order (the fleet role's), and a daemon stopped on purpose
        (its start record removed) is not expected to run: neither warns. A daemon that was started - its start
        record, or files of its pipe directory, are still there - and is not running now (a crash, a kill) is.
        """
        if not persist_limits:
            return 'the MPS control daemon of %r is not running and record=false: nothing was done' % self.paths.name
        kept = 'the limits %s persisted' % ('would be' if self.check_mode else 'are')
        state = self.state
        if state is None or not state.stale:
            return ('the MPS control daemon of %r is not running (not started yet, or stopped): %s, not applied now; its next '
                    'start applies them' % (self.paths.name, kept))
        record = self.view.resource(self.paths.name).record
        if record is not None:
            since = 'was started (%s)' % (record.started_at or 'at an unknown time')
        else:
            since = 'left %s in %s' % (', '.join(state.leftovers), self.paths.pipe_dir)
        msg = ('the MPS control daemon of %r %s but is not running now (crashed or killed?): %s, not applied now; they will '
               'be applied when it starts again' % (self.paths.name, since, kept))
        if not self.start_follows:
            warnings.append(msg)
        return msg

    def _apply(self, cmds: t.Sequence[str]) -> None:
        if self.daemon is None:
            return
        check_applied(self.daemon.query(cmds))

    @staticmethod
    def _describe(wanted: Limits, scope: t.Sequence[Gpu]) -> t.Dict[str, t.Any]:
        by_ordinal = {}
        by_uuid = {}
        for ordinal, gpu in enumerate(scope):
            mib = wanted.mem_for(gpu.uuid)
            if mib is not None:
                by_ordinal[str(ordinal)] = '%dM' % mib
                by_uuid[gpu.uuid] = '%dM' % mib
        return {'active_thread_percentage': wanted.active_thread_percentage, 'replicas': wanted.replicas,
                'client_priority': PRIORITY_NAMES.get(wanted.client_priority) if wanted.client_priority is not None else None,
                'sm_partitions': list(wanted.sm_partitions),
                'pinned_device_mem_limit': {'by_ordinal': by_ordinal, 'by_uuid': by_uuid},
                'devices': [dict(gpu.summary(), ordinal=ordinal) for ordinal, gpu in enumerate(scope)]}
