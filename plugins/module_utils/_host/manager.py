# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The whole MPS state of one host in one run: observe, decide one list of changes, execute exactly that list.

Validation (:func:`.entries.resolve_entries` and every resource's options) raises before anything is read from the
daemons or changed. Then, under the host lock (the root's ``flock``: one run at a time, a bounded wait), the run
plans every change of the host into one ordered list - the same list in check mode and in a real run, by
construction: check mode returns it, a real run executes it, change by change, and reports each change only after
its side effect returned. The order always works:

1. waits for busy clients (``busy=wait``): a wait that times out has changed nothing;
2. the ready mark withdrawn, when the plan brings any resource down (a run killed after this never leaves a ready
   mark over a down resource);
3. the shared tmpfs (daemons started with ``shm`` need it);
4. removed resources (``prune``): daemon stopped, unit, record and persisted limits removed (logs kept);
5. listed resources whose daemon restarts (GPUs, multiuser, a limit MPS only drops with a restart...): stopped, so that
   GPU moves between resources, renames and swaps all work in one run; a GPU that stays in use keeps its compute mode;
6. each listed resource: limits persisted (and sent to a running daemon), then its daemon started (the start replays
   the limits);
7. the health timer, log rotation, local facts, and last the ready mark, after every listed daemon answered.

A failed change stops the run; a start that failed gives its GPUs their compute mode back and its persisted limits
their previous content, and the error says what was done and what was not. A run that changes nothing costs one NVML
session and one control UI process per running daemon.
"""

from __future__ import annotations

import shutil
import typing as t
from dataclasses import dataclass, field

from .._daemon.manager import DaemonSetup, HostContext
from .._errors import DaemonTimeoutError, InvalidParameterError, MpsError
from .._gpus import Gpu, Nvml
from .._io import refuse_unsafe_dirs, remove, rmdir_if_empty
from .._limits.manager import LimitsManager
from .._observe.view import HostView
from .._options import RESOURCE_KEYS
from .._outcome import Outcome
from .._resource.layout import validate_root
from .._resource.lock import HostLock
from .._supervisor.unit import UNIT_DIR, Systemctl, systemd_is_pid1
from .around import READY_FILE, Around, check_around, check_paths
from .decide import decide_ready, order_steps, pending_warning
from .facts import facts_text, local_facts
from .observe import observe, shm_manager
from .entries import ResourceEntry, resolve_entries
from .result import planned_resource, resource_result

__all__ = ['HostManager', 'HostOutcome', 'READY_FILE']


@dataclass
class HostOutcome(Outcome):
    """The host's change, with every resource's own."""

    resources: t.List[t.Dict[str, t.Any]] = field(default_factory=list)
    removed: t.List[str] = field(default_factory=list)
    ready: t.Optional[bool] = None
    unhealthy: t.Dict[str, str] = field(default_factory=dict)
    facts: t.Optional[t.Dict[str, t.Any]] = None
    ui_processes: int = 0

    def take(self, name: str, out: Outcome) -> None:
        """One resource's (or part's) planned changes, named, in this run's order."""
        self.changed = self.changed or out.changed
        for change in out.changes:
            change.resource = change.resource or name
        self.actions.extend('%s: %s' % (name, action) for action in out.actions)
        self.changes.extend(out.changes)
        # Said once: several removed resources each find the same root or config directory kept, for the same reason.
        self.warnings.extend(warning for warning in out.warnings if warning not in self.warnings)
        self.steps.extend(out.steps)


@dataclass
class _Resource:
    """One resource of the run: listed (``entry``) or to be removed (``entry`` is None)."""

    name: str
    setup: DaemonSetup
    entry: t.Optional[ResourceEntry] = None
    limits: t.Optional[t.Any] = None
    daemon: t.Optional[t.Any] = None
    restart: bool = False
    # The first half of its restart (every stop of the plan comes before any start), and the limits read before it.
    stop: t.Optional[t.Any] = None
    first_limits: t.Optional[t.Any] = None


def _as_entry(exc: InvalidParameterError, name: str) -> InvalidParameterError:
    """A refusal of an entry's own key, named as the user wrote it (``resources[train].sm_partitions``)."""
    return exc.within('resources[%s]' % name) if exc.param in RESOURCE_KEYS else exc


class HostManager:
    """One host's MPS: its listed resources, what is removed, and the files around them."""

    def __init__(self, params: t.Mapping[str, t.Any], nvml: Nvml, binary: t.Callable[[t.Optional[str]], str], *, check_mode: bool,
                 unit_dir: str = UNIT_DIR) -> None:
        self.params = params
        self.nvml = nvml
        self.binary = binary
        self.check_mode = check_mode
        self.unit_dir = unit_dir
        self.root = validate_root(params['root'])
        self.config_dir = validate_root(params['config_dir'], 'config_dir')
        check_paths(params)
        systemctl_path = shutil.which('systemctl')
        self.systemctl = Systemctl(systemctl_path) if systemctl_path and systemd_is_pid1() else None
        self.around = Around(params, self.root, self.config_dir, unit_dir, self.systemctl)
        # The run's one view of the host (_observe.view.HostView), read by observe() under the host lock, then sealed.
        self.view: t.Optional[HostView] = None
        # The shared tmpfs's manager (_shm.ShmManager, or None), made by observe(): after the entries are validated and
        # under the host lock, so that its refusals (shm_persist, selinux_type) come after the entries' as they always did.
        self.shm: t.Optional[t.Any] = None
        # What the plan found worth saying without refusing (devices: all leaving out GPUs in MIG mode).
        self.plan_warnings: t.List[str] = []

    # --- validation --------------------------------------------------------------------------------
    def _setup(self, name: str, state: str, entry: t.Optional[ResourceEntry]) -> DaemonSetup:
        p = self.params
        values = dict(root=self.root, config_dir=self.config_dir, control_binary=p['control_binary'], name=name, state=state,
                      devices=[gpu.uuid for gpu in entry.devices] if entry else 'all', multiuser=entry.multiuser if entry else False,
                      compute_mode=p['compute_mode'], supervisor=p['supervisor'], start_timeout=p['start_timeout'],
                      stop_timeout=p['stop_timeout'], busy=p['busy'], busy_timeout=p['busy_timeout'], log_mode=p['log_mode'],
                      shm=p['shm'], container_root=p['container_root'], selinux_type=p['selinux_type'],
                      unit_before=p['unit_before'], unit_after=p['unit_after'])
        try:
            return DaemonSetup.from_params(values, self.binary, unit_dir=self.unit_dir)
        except InvalidParameterError as exc:
            raise _as_entry(exc, name) if entry is not None else exc

    def validate(self, gpus: t.Sequence[Gpu]) -> t.List[_Resource]:
        """The listed resources, every option checked; nothing read from a daemon, nothing changed."""
        p = self.params
        self.plan_warnings = []
        entries = resolve_entries(p['resources'], gpus, 'resources', warnings=self.plan_warnings, root=self.root,
                                  protocol=p.get('protocol')) if p['state'] == 'present' else []
        if p['state'] == 'present':
            if p['shm']:
                # Imported here, as everything only shm needs: AnsiballZ compiles every module imported, on every run.
                from .._tmpfs import size_kib  # pylint: disable=import-outside-toplevel
                size_kib(p['shm_size'], param='shm_size')
            check_around(self.params, self.root, systemd=self.systemctl is not None)
        listed = [_Resource(entry.name, self._setup(entry.name, 'started', entry), entry) for entry in entries]
        for res in listed:
            if res.entry.v3 is not None:  # imported here: a legacy fleet never compiles it
                from .._v3.plan import set_up  # pylint: disable=import-outside-toplevel
                set_up(res.setup, res.entry.v3)
        return listed

    def removed_setups(self, view: HostView, listed: t.Sequence[_Resource]) -> t.List[_Resource]:
        """The resources the view found (under the root, or with files in the config directory) that are not listed, to be
        removed (state=absent, or prune): innermost first, so that a nested name's directory empties its parent's."""
        p = self.params
        if not (p['state'] == 'absent' or p['prune']):
            return []
        names = {res.name for res in listed}
        found = [name for name in view.resources if name not in names]
        return [_Resource(name, self._setup(name, 'absent', None)) for name in sorted(found, key=lambda name: (-name.count('/'), name))]

    # --- the run -----------------------------------------------------------------------------------
    def lock_timeout(self) -> int:
        """Long enough for another run's busy wait, stops and starts; bounded."""
        p = self.params
        return int(p['busy_timeout'] if p['busy'] == 'wait' else 0) + 2 * (p['start_timeout'] + p['stop_timeout']) + 60

    def ensure(self, gpus: t.Sequence[Gpu]) -> HostOutcome:
        """Observe the host once under its lock, decide every change from that view alone, execute exactly them."""
        listed = self.validate(gpus)
        # A real run creates the root first, the lock's directory (a run on a new host waits for another run on it too),
        # and removes it again when it is refused.
        create = not self.check_mode and self.params['state'] == 'present'
        with HostLock(self.root, exclusive=not self.check_mode, timeout=self.lock_timeout(), create=create) as lock:
            if lock.waited:
                # Another run changed the host meanwhile: plan from what it left.
                self.nvml.refresh()
                listed = self.validate(self.nvml.gpus())
            self.view = None
            try:
                removed = self.observe(listed)
                out = self.decide(listed, removed, self.view)
            except MpsError as exc:
                lock.discard()
                self.refused(listed, exc)
                raise
            if not self.check_mode and out.changed:
                # Imported here: a run that changes nothing never compiles it (AnsiballZ compiles what is imported).
                from .._execute import execute  # pylint: disable=import-outside-toplevel
                execute(out)
            self._results(listed, out)
        out.ui_processes = sum(res.setup.daemon.client.processes for res in listed + removed)
        out.warnings[:0] = self.plan_warnings
        return out

    def refused(self, listed: t.Sequence[_Resource], exc: MpsError) -> None:
        """A refused run changes nothing - but the ready mark: withdrawn when a listed resource no longer answers (its
        daemon is not running, or did not answer), which ``exc``'s message then says (check mode: that it would be)."""
        if not self.params['ready'] or self.params['state'] != 'present':
            return
        view = self.view
        down = sorted(res.name for res in listed if view is not None and res.name in view.resources
                      and not view.resources[res.name].liveness.running)
        if isinstance(exc, DaemonTimeoutError):
            down.append('a daemon that did not answer in time')
        ready = self.around.ready_path
        if not down:
            return
        if self.check_mode:
            if view is None or ready not in view.paths or not view.paths.lexists(ready):
                return
        else:
            try:
                if not remove(ready):
                    return  # there was none
            except OSError:
                return  # not a file: its own refusal names it on the next run
        exc.msg = '%s; %s %s: %s no longer answer%s' % (
            exc.msg, ready, 'would be withdrawn' if self.check_mode else 'was withdrawn', ', '.join(down),
            's' if len(down) == 1 else '')
        exc.args = (exc.msg,)
        exc.details = dict(exc.details, ready_withdrawn=not self.check_mode)

    def observe(self, listed: t.List[_Resource]) -> t.List[_Resource]:
        """The host read once (:func:`.observe.observe`) into the sealed view every decision reads; the resources the
        view shows to be removed."""
        self.shm = shm_manager(self.params, self.root, self.unit_dir, check_mode=self.check_mode)
        self.view, removed = observe(self, listed)
        return removed

    def decide(self, listed: t.List[_Resource], removed: t.List[_Resource], view: HostView) -> HostOutcome:
        """The plan, from the view alone: no file, process, socket or stat (a unit test makes them raise here)."""
        p = self.params
        self.view = self.around.view = view
        refuse_unsafe_dirs([(self.root, 'root'), (self.config_dir, 'config_dir')], view.paths)
        absent = p['state'] == 'absent'
        orphans = view.orphans()
        if orphans:
            # Imported here: a host without orphans never compiles it (AnsiballZ compiles what is imported).
            from .orphans import end_orphans, refuse_orphans  # pylint: disable=import-outside-toplevel
            if p['orphans'] != 'stop':
                refuse_orphans(orphans, self.root)
        ignore = frozenset(res.name for res in listed + removed)
        would_remove: t.List[str] = []
        ending = frozenset(daemon.pid for daemon in orphans)

        def context(**values: t.Any) -> HostContext:
            """What every resource's manager is told by this plan (the one view, what it removes, what it ends first)."""
            return HostContext(ignore, would_remove, ending_pids=ending, view=view, **values)

        kept = frozenset(gpu.uuid for res in listed for gpu in res.entry.devices) if p['compute_mode'] != 'unchanged' else frozenset()
        # Each listed resource decided once: its limits, then its daemon - a restart split into its stop half (every stop
        # of the plan before any start: GPU moves, swaps and renames in one run) and its start half, which replays the
        # limits, so that nothing is sent to the daemon it replaces.
        for res in listed:
            try:
                res.limits = self._limits(res)
                res.daemon = self._daemon(res, 'restarted' if res.limits.restart_needed else 'started', context(
                    restart_reason=res.limits.restart_needed, shm_planned=p['shm'], keep_modes=kept, split_restart=True,
                    **self._planned_limits(res)))
            except InvalidParameterError as exc:
                raise _as_entry(exc, res.name)
            res.restart = res.daemon.restarting
            if res.restart:
                res.stop, res.first_limits = res.daemon.first, res.limits
                res.limits = res.limits.restarted()
        body = HostOutcome()
        if orphans:
            end_orphans(body, orphans, view, p, kept, ignore, self.nvml)
        if not absent:
            self._shm(body)
        keep_template = any(res.setup.supervisor == 'systemd' for res in listed)
        for res in removed:
            res.daemon = self._daemon(res, 'absent', context(keep_modes=kept, keep_template=keep_template))
            body.take(res.name, res.daemon)
            body.removed.append(res.name)
        if absent:
            self._shm(body)
        for res in listed:
            if res.restart:
                body.take(res.name, res.stop)
        for res in listed:
            body.take(res.name, res.limits)
            body.take(res.name, res.daemon)
        body.warnings += pending_warning([(res.name, res.limits.pending) for res in listed if not res.restart])
        return self._order(body, listed, absent=absent)

    def _order(self, body: HostOutcome, listed: t.List[_Resource], *, absent: bool) -> HostOutcome:
        """Waits first, then the ready mark withdrawn if anything goes down, the body, the files around, the mark last."""
        out = HostOutcome(removed=body.removed, warnings=list(body.warnings))
        down = ([res.name for res in listed if res.restart or res.daemon.before.get('state') != 'running'] + list(body.removed)
                + [change.resource for change in body.changes if change.kind == 'stop' and change.action.startswith('end the orphan')])
        ready = decide_ready(absent=absent, listed=[res.name for res in listed], down=down, enabled=bool(self.params['ready']),
                             exists=self.around.ready_exists())
        head = Outcome()
        paused = False
        if absent:
            self.around.health(head, wanted_here=False)  # first: the timer would write the mark back while daemons still answer
        elif down:
            paused = self.around.pause_health(head)  # the same, while this run restarts or starts daemons
        if ready.withdraw:
            self.around.withdraw_ready(head, ready.withdraw)
        tail = Outcome()
        if not absent:
            self.around.health(tail, wanted_here=bool(listed), paused=paused)
        self.around.logrotate(tail, present=not absent)
        self.around.slurm(tail, [res.entry for res in listed if res.entry] if not absent and self.params['slurm_hook'] else None)
        if not absent and self.params['local_facts']:
            out.facts = local_facts([res.entry.as_dict() for res in listed if res.entry], [planned_resource(res) for res in listed],
                                    [gpu.facts() for gpu in self.view.gpus], self.root)
        self.around.local_facts(tail, facts_text(out.facts) if out.facts is not None else None)
        if absent:
            self.around.drop_bytecode(tail)
        if absent and self.params['remove_logs']:
            tail.step(lambda: rmdir_if_empty(self.root))
        if ready.mark:
            self.around.mark_ready(tail, lambda: self._check_healthy(listed))
        for change in head.changes + tail.changes:
            change.resource = 'host'
        out.warnings += head.warnings + tail.warnings
        out.steps = order_steps(body.steps, head.steps, tail.steps, lambda step: step[0] is not None and step[0].kind == 'wait')
        out.changes = [change for change, _run in out.steps if change is not None]
        out.actions = ['%s: %s' % (change.resource, change.text) for change in out.changes]
        out.changed = bool(out.changes)
        return out

    # --- one resource ------------------------------------------------------------------------------
    @staticmethod
    def _planned_limits(res: _Resource) -> t.Dict[str, t.Any]:
        return dict(limits=res.limits.wanted, limits_replay_for=res.limits.replay_for, limits_planned=True)

    def limits_manager(self, res: t.Any, view: t.Optional[HostView] = None) -> LimitsManager:
        """The limits manager of a listed resource, deciding from the run's view (``view``: the one being read)."""
        entry = res.entry
        if entry is None:
            raise MpsError('internal error: limits of the removed resource %s were asked for' % res.name)
        view = view or self.view
        running = view is not None and view.resource(res.name).liveness.running
        return LimitsManager(res.setup.paths, res.setup.config, res.setup.daemon if running else None,
                             view.gpus if view is not None else self.nvml.gpus(), check_mode=self.check_mode, view=view, entry=entry,
                             prober=res.setup.daemon)

    def _limits(self, res: _Resource) -> t.Any:
        entry = res.entry
        if entry.v3 is not None:
            from .._v3.plan import plan_for_host  # pylint: disable=import-outside-toplevel
            return plan_for_host(res.name, entry.v3, res.setup, self.params, self.view, check_mode=self.check_mode)
        manager = self.limits_manager(res)
        return manager.plan(entry.active_thread_percentage, entry.pinned_device_mem_limit, entry.replicas, self.params['running_servers'])

    def _daemon(self, res: _Resource, state: str, host: HostContext) -> t.Any:
        p = self.params
        manager = res.setup.manager(self.nvml, check_mode=self.check_mode, host=host)
        if res.entry is None:
            # A pruned resource keeps its logs; a teardown removes them when asked to.
            return manager.plan('absent', 'all', multiuser=False, compute_mode=p['compute_mode'], enabled=False, shm=False,
                                remove_logs=p['remove_logs'] and p['state'] == 'absent')
        return manager.plan(state, [gpu.uuid for gpu in res.entry.devices], multiuser=res.entry.multiuser,
                            compute_mode=p['compute_mode'], enabled=True, shm=p['shm'], foreground=p['foreground'], v3=res.entry.v3)

    def _shm(self, out: HostOutcome) -> None:
        manager = self.shm
        if manager is None:
            return
        absent = self.params['state'] == 'absent'
        if absent and manager.never_here(self.view):
            return
        out.take('shm', manager.plan('absent' if absent else 'mounted', self.params['shm_size'], view=self.view))

    # --- after -------------------------------------------------------------------------------------
    def _check_healthy(self, listed: t.List[_Resource]) -> None:
        """Before the ready mark: every listed daemon runs and answers (one UI process for one not heard from yet)."""
        unhealthy = {}
        for res in listed:
            item = resource_result(res, check_mode=False)
            if not item['healthy']:
                unhealthy[res.name] = item['reason']
        if unhealthy:
            raise MpsError('MPS daemons not healthy: %s (see the control.log in each one\'s log directory under %s)' % (
                '; '.join('%s: %s' % item for item in sorted(unhealthy.items())), self.root), unhealthy=unhealthy)

    def _results(self, listed: t.List[_Resource], out: HostOutcome) -> None:
        """Every listed resource as it is after the run (check mode: as planned)."""
        # A run that changed nothing reports the host as it observed it; one that did observes it again.
        again = not self.check_mode and bool(out.executed)
        for res in listed:
            item = resource_result(res, check_mode=self.check_mode, seen=None if again or self.view is None else self.view.resource(res.name))
            if not item.pop('healthy_now', True):
                out.unhealthy[res.name] = item['reason']
            item.pop('reason', None)
            out.resources.append(item)
        if self.params['state'] == 'present':
            out.ready = bool(listed) and not out.unhealthy
        if self.params['state'] == 'present' and out.unhealthy and not self.check_mode:
            if self.params['ready']:
                remove(self.around.ready_path)
            raise MpsError('MPS daemons not healthy: %s (see the control.log in each one\'s log directory under %s)' % (
                '; '.join('%s: %s' % item for item in sorted(out.unhealthy.items())), self.root), unhealthy=out.unhealthy)
