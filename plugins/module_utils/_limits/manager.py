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
from .._errors import InvalidParameterError, MpsError
from .._outcome import Outcome
from .._protocol.commands import PRIORITY_NAMES, SET_DEFAULT_PRIORITY, SM_PARTITION, check_applied
from .._supervisor.process import Daemon
from .._gpus import Gpu, all_devices
from .._io import refuse_unsafe_dirs
from .._observe.reader import read_daemon, read_help, read_host, read_process
from .._observe.scan import orphan_warnings
from .._resource.layout import ConfigPaths, ResourcePaths, managed_dirs
from .._resource.lock import resource_lock
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
from .observe import DaemonScope, daemon_scope, file_reader, read_limits, static_running, usable
from .partition_plan import plan_partitions
from .partitions import check_partition_gpus, parse_partitions, partitions_view
from .priority import check_priority_offered
from .store import read_persisted
from .writes import plan_forget, plan_writes


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


class LimitsManager:
    """Limits of one resource."""

    def __init__(self, paths: ResourcePaths, config: ConfigPaths, daemon: t.Optional[Daemon], gpus: t.Sequence[Gpu], *,
                 check_mode: bool, view: t.Optional[t.Any] = None, oversubscribe: bool = False, client_priority: t.Any = None,
                 sm_partitions: t.Any = None, missing_binary: t.Optional[MpsError] = None, entry: t.Any = None,
                 prober: t.Optional[Daemon] = None) -> None:
        """``entry``: mps_host's resource entry (_host.entries.ResourceEntry) - the limits are then exact (declarative) and
        its own options win; ``prober``: the daemon whose binary's help is read where none runs (mps_host: the
        resource's own, before its start)."""
        self.paths = paths
        self.config = config
        self.daemon = daemon
        self.gpus = list(gpus)
        self.check_mode = check_mode
        # The run's one view of the host (_observe.view.HostView) that plan() decides from: mps_host's (mps_limits' own
        # run reads its own under the resource's lock, ensure()).
        self.view = view
        # mps_host's entry (_host.entries.ResourceEntry), its values checked and parsed once, by the plan.
        self.entry = entry
        # Exact (declarative) limits, as mps_host manages them: what is not given is not wanted - no inheritance from
        # the persisted record, a thread percentage not given is 100, a memory limit not given is none.
        self.exact = entry is not None
        # mps_host: the devices the plan gives the resource. When the daemon runs on others (a GPU move, a MIG instance
        # re-created), it restarts on these: the limits are checked and persisted for them, not sent to the old daemon.
        self.planned: t.Optional[t.List[Gpu]] = list(entry.devices) if entry is not None else None
        # mps_host: the same plan starts the daemon (every listed resource runs after it): a daemon found dead is
        # recovered there and its limits replayed, so its absence now is no warning of the limits' own.
        self.start_follows = entry is not None
        # Whether replicas times an explicit pinned limit may exceed a GPU's memory (mps_limits oversubscribe).
        self.oversubscribe = entry.oversubscribe if entry is not None else oversubscribe
        # The default client priority wanted (mps_limits client_priority, a resources entry's): as given, None: not given.
        self.client_priority: t.Any = entry.client_priority if entry is not None else client_priority
        # The static SM partitions wanted on each GPU (mps_limits sm_partitions, a resources entry's): chunk counts; None: not given.
        self.sm_partitions: t.Any = entry.sm_partitions if entry is not None else sm_partitions
        # Whose binary's help says whether it has client priority, where no running daemon answered (mps_host gives the
        # resource's daemon even when it is not running yet); None: self.daemon.
        self.prober: t.Optional[Daemon] = prober
        # Why there is no daemon to talk to (mps_limits without a usable control binary): said when one runs.
        self.missing_binary: t.Optional[MpsError] = missing_binary

    # --- what the run reads ------------------------------------------------------------------------
    def scope(self, view: t.Any, *, create: bool) -> DaemonScope:
        """The daemon's GPUs in ordinal order, whether it runs, and its pid, as ``view`` has them."""
        return daemon_scope(view, self.paths, self.config, self.gpus, planned=self.planned, create=create)

    def probe(self, view: t.Any) -> None:
        """What the decision about these limits needs beyond the files, read into ``view`` before it is sealed: the
        running daemon's one control batch (its defaults for its devices, its servers, its partitions where started with
        -S), its process, and - where a wanted limit needs a command its binary may lack and no daemon answered - the
        binary's help text."""
        seen = view.resource(self.paths.name)
        if seen.problem is None and seen.liveness.running and seen.liveness.pid:
            read_process(view, seen.liveness.pid, None, record_known=seen.record is not None)
        scope = self.scope(view, create=True)
        prober = self.prober or self.daemon
        missing = self.missing_binary
        if scope.running and self.daemon is None and missing is not None:
            # a running daemon needs the control binary: why there is none, as it was said
            raise MpsError(missing.msg, **missing.details)
        if scope.running and scope.pid and self.daemon is not None:
            if self.paths.name not in view.readouts or view.readouts[self.paths.name][0] != (len(scope.gpus), scope.pid):
                read_daemon(view, self.paths.name, self.daemon.query, len(scope.gpus), scope.pid, partitions=static_running(view, scope))
            self.daemon.answered = True
            if self.sm_partitions and not static_running(view, scope) and prober is not None:
                read_help(view, prober, SM_PARTITION)  # a daemon without -S cannot say: its binary's help can
            return
        if prober is None:
            return
        if self.client_priority is not None:
            read_help(view, prober, SET_DEFAULT_PRIORITY)
        if self.sm_partitions:
            read_help(view, prober, SM_PARTITION)

    def observe_own(self) -> t.Any:
        """The resource read once for mps_limits' own run (mps_host reads a whole host, :meth:`probe` each resource): the
        sealed view."""
        view = read_host(self.paths.root, self.gpus, [(self.paths, self.config)])
        self.probe(view)
        return view.seal()

    def ensure(self, percentage: t.Any, mem: t.Any, replicas: t.Any, running_servers: str, *, persist_limits: bool,
               create: bool) -> LimitsOutcome:
        """mps_limits: read the resource under its lock (the lock belongs to the resource, not to its daemon: taken whether
        or not one runs, so a concurrent mps_daemon start never replays a half-written record), decide, and (unless in
        check mode) execute exactly that; a refused run leaves nothing behind, not even the lock it made."""
        self._check(percentage, mem, replicas, running_servers)
        # Imported here: mps_host, which imports this module on every run, executes through its own caller.
        from .._execute import execute  # pylint: disable=import-outside-toplevel
        if self.check_mode:
            view = self.observe_own()
            return self._reported(view, self._plan(view, percentage, mem, replicas, running_servers,
                                                   persist_limits=persist_limits, create=create))
        with resource_lock(self.paths) as lock:
            view = self.observe_own()
            try:
                out = self._plan(view, percentage, mem, replicas, running_servers, persist_limits=persist_limits, create=create)
            except MpsError:
                lock.discard()
                raise
            execute(self._reported(view, out))
            out.ui_processes = self.daemon.client.processes if self.daemon else 0
            return out

    def _reported(self, view: t.Any, out: LimitsOutcome) -> LimitsOutcome:
        """The root's orphans said, never acted on (gpufleet.mps.mps_host does)."""
        out.warnings += orphan_warnings(view.orphans(), all_devices(self.gpus))
        return out

    # --- what is wanted ---------------------------------------------------------------------------
    def wanted(self, scope: t.Sequence[Gpu], percentage: t.Any, mem: t.Any, replicas: t.Any, *, previous: t.Optional[Limits],
               scope_known: bool) -> Limits:
        """The limits wanted, every value checked against the daemon's GPUs (``scope``); what mps_limits is not given
        keeps its value in ``previous`` (the persisted limits).

        Before the first start of a new resource its GPUs are not known yet (not ``scope_known``; ``scope`` is every GPU of
        the host): what is meant for every GPU of the daemon - one size, a replica count - is then refused only when no GPU
        of the host could take it, so that a limit meant for the large GPUs of a mixed host is not refused for the
        small ones of another resource. The fleet role's pre-flight checks it against the resource's own GPUs.
        """
        if self.entry is not None:
            return self.entry.wanted_limits()  # mps_host: exact, checked once by its plan
        # what is not given keeps its persisted value (mps_limits)
        previous = previous or Limits()
        limits = Limits(previous.active_thread_percentage, dict(previous.pinned_device_mem_limit), previous.replicas,
                        previous.client_priority, previous.sm_partitions)
        unknown = not scope_known and bool(scope)
        if replicas is not None:
            # The count as a number from here on ("4" from a template is 4; anything else is refused here).
            replicas = limits.replicas = check_replicas(replicas, [max(scope, key=lambda gpu: gpu.max_mps_clients)] if unknown
                                                        else scope)
            # The resource's own GPUs where they are known (its daemon's); before its first start, every GPU it could be
            # given - its start keeps those of its own (add_replica_shares, own_shares).
            own = scope if scope_known else usable(self.gpus)
            limits.active_thread_percentage, limits.pinned_device_mem_limit = replica_limits(replicas, own)
        if percentage is not None:
            limits.active_thread_percentage = parse_wanted_percentage(percentage)
        if self.client_priority is not None:
            limits.client_priority = parse_priority(self.client_priority)
        if self.sm_partitions is not None:
            limits.sm_partitions = parse_partitions(self.sm_partitions)
            check_partition_gpus(limits.sm_partitions, scope if scope_known else [])
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
        return self._plan(self.view, percentage, mem, replicas, running_servers, persist_limits=True, create=True)

    def _check(self, percentage: t.Any, mem: t.Any, replicas: t.Any, running_servers: str) -> None:
        if running_servers not in RUNNING_SERVERS_CHOICES:
            raise InvalidParameterError('running_servers', 'must be one of %s' % ', '.join(RUNNING_SERVERS_CHOICES))
        if (percentage is None and mem is None and replicas is None and self.client_priority is None and self.sm_partitions is None
                and not self.exact):
            raise InvalidParameterError('active_thread_percentage', 'give at least one of active_thread_percentage, '
                                        'pinned_device_mem_limit, replicas, client_priority or sm_partitions')

    def _plan(self, view: t.Any, percentage: t.Any, mem: t.Any, replicas: t.Any, running_servers: str, *, persist_limits: bool,
              create: bool) -> LimitsOutcome:
        """Plan every action from ``view`` (the daemon's one control batch, the record); nothing is read or changed here."""
        refuse_unsafe_dirs(managed_dirs(self.paths, self.config.config_dir), view.paths)
        reader = file_reader(view, self.config, self.paths.name)
        scope = self.scope(view, create=create)
        running = scope.running
        persisted = read_persisted(self.config, reader)
        wanted = self.wanted(scope.gpus, percentage, mem, replicas, previous=persisted, scope_known=scope.scope_known)
        out = LimitsOutcome(running=running, wanted=wanted)
        out.limits = describe(wanted, scope.gpus)
        if replicas is not None and (self.planned is not None or scope.scope_known):
            out.warnings += replica_warnings(wanted.replicas, self.planned if self.planned is not None else scope.gpus)
        if not self.exact and scope.scope_known and (percentage is not None or replicas is not None):
            # mps_limits; mps_host's plan says it once for the whole host (_host/entries.py).
            out.warnings += less_than_one_sm(wanted.active_thread_percentage, scope.gpus,
                                             'active_thread_percentage' if percentage is not None else 'replicas')
        # Observed (one UI process for a running daemon), then decided by a pure function of it.
        readout = None
        if running:
            pct, mem_read, servers, readout = read_limits(view, self.paths.name, scope)
            seen = LimitsSeen(persisted, running=True, percentage=pct, mem=mem_read, servers=tuple(servers),
                              priority=readout.default_priority, priority_text=readout.priority_text)
        else:
            seen = LimitsSeen(persisted)
        check_priority_offered(view, self.paths.name, self.prober or self.daemon, wanted, seen)
        uuids = [gpu.uuid for gpu in scope.gpus]
        decision = decide_limits(wanted, uuids, seen, exact=self.exact, running_servers=running_servers, name=self.paths.name)
        partitions = plan_partitions(view, self.paths.name, wanted, persisted, uuids, readout, running=running,
                                     static=running and static_running(view, scope), exact=self.exact,
                                     prober=self.prober or self.daemon)
        partitions.add_to(decision)
        out.sm_partitions = partitions_view(partitions.seen)
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
            out.msg = self._not_running(scope, out.warnings, persist_limits=persist_limits)
        if persist_limits and self.exact and wanted.empty:
            plan_forget(out, self.config, reader)
        elif persist_limits:
            plan_writes(out, view, self.config, wanted, uuids, order_known=scope.order_known, reader=reader)
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

    def _not_running(self, scope: DaemonScope, warnings: t.List[str], *, persist_limits: bool) -> str:
        """Why nothing was applied to a daemon; a warning only when one was expected to run.

        Persisting before the first start is the normal order (the fleet role's), and a daemon stopped on purpose
        (its start record removed) is not expected to run: neither warns. A daemon that was started - its start
        record, or files of its pipe directory, are still there - and is not running now (a crash, a kill) is.
        """
        if not persist_limits:
            return 'the MPS control daemon of %r is not running and record=false: nothing was done' % self.paths.name
        kept = 'the limits %s persisted' % ('would be' if self.check_mode else 'are')
        liveness = scope.liveness
        if not liveness.stale:
            return ('the MPS control daemon of %r is not running (not started yet, or stopped): %s, not applied now; its next '
                    'start applies them' % (self.paths.name, kept))
        record = scope.record
        if record is not None:
            since = 'was started (%s)' % (record.started_at or 'at an unknown time')
        else:
            since = 'left %s in %s' % (', '.join(liveness.leftovers), self.paths.pipe_dir)
        msg = ('the MPS control daemon of %r %s but is not running now (crashed or killed?): %s, not applied now; they will '
               'be applied when it starts again' % (self.paths.name, since, kept))
        if not self.start_follows:
            warnings.append(msg)
        return msg

    def _apply(self, cmds: t.Sequence[str]) -> None:
        if self.daemon is None:
            return
        check_applied(self.daemon.query(cmds))


def describe(wanted: Limits, scope: t.Sequence[Gpu]) -> t.Dict[str, t.Any]:
    """The limits as the modules return them (``limits``), for the daemon's GPUs ``scope``."""
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
