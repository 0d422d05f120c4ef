# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The whole MPS state of one host in one run: validate everything, plan every resource, then apply in an order
that always works.

Validation (:func:`..plan.plan_resources` and every resource's options) raises before anything is read from the
daemons or changed, ``<root>/.ready`` included. Planning runs each resource's managers in check mode - the same
code that applies - so the plan gives ``changed``, ``actions`` and ``diff``, and refusals (a busy daemon, a GPU that
a daemon of another root serves) come before any side effect. Applying, when the plan changes anything:

1. the shared tmpfs (daemons started with ``shm`` need it);
2. removed resources (``prune``): daemon stopped, unit, record and persisted limits removed (logs kept);
3. listed resources whose daemon restarts (GPUs, multiuser, a limit MPS can only drop with a restart...): stopped,
   so that GPU moves between resources, renames and swaps all work in one run;
4. each listed resource: limits persisted (and applied to a running daemon), then its daemon started (the start
   replays the limits);
5. the health check, the ready mark, log rotation, local facts.

A run that changes nothing costs one NVML session and one control UI process per running daemon.
"""

from __future__ import annotations

import os
import shutil
import typing as t
from dataclasses import dataclass, field

from .._daemon.manager import DaemonSetup, ResourceManager
from .._errors import ControlBinaryError, DaemonTimeoutError, InvalidParameterError, MpsError
from .._gpus import Gpu, Nvml
from .._io import atomic_write, ensure_dir, read_text, refuse_unsafe_dirs, remove
from .._limits.manager import LimitsManager
from .._outcome import Outcome
from .._resource.layout import validate_root
from .._resource.scan import scan_config, scan_resources
from .._resource.store import persisted_facts, read_persisted
from .._shm import ShmManager, size_kib
from .._supervisor.health import HEALTH_NAME, render_health
from .._supervisor.logrotate import render_logrotate
from .._supervisor.process import inspect
from .._supervisor.unit import UNIT_DIR, Systemctl, systemd_is_pid1
from .facts import FACT_FILE, facts_text, local_facts
from .plan import ResourcePlan, plan_resources

READY_FILE = '.ready'
LOGROTATE_FILE = 'gpufleet-mps'
HEALTH_TIMER = HEALTH_NAME + '.timer'


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
        """One resource's (or part's) planned actions, named, in this run's order."""
        self.changed = self.changed or out.changed
        self.actions.extend('%s: %s' % (name, action) for action in out.actions)
        self.warnings.extend(out.warnings)
        self.steps.extend(out.steps)


@dataclass
class _Resource:
    """One resource of the run: listed (``plan``) or to be removed (``plan`` is None)."""

    name: str
    setup: DaemonSetup
    plan: t.Optional[ResourcePlan] = None
    limits: t.Optional[t.Any] = None
    daemon: t.Optional[t.Any] = None
    restart: bool = False
    # Recorded devices NVML no longer reports, found when the daemon was stopped for its restart.
    gone: t.List[t.Dict[str, str]] = field(default_factory=list)


class HostManager:
    """One host's MPS: its listed resources, what is removed, and the files around them."""

    def __init__(self, params: t.Mapping[str, t.Any], nvml: Nvml, binary: t.Callable[[t.Optional[str]], str], check_mode: bool,
                 unit_dir: str = UNIT_DIR) -> None:
        self.params = params
        self.nvml = nvml
        self.binary = binary
        self.check_mode = check_mode
        self.unit_dir = unit_dir
        self.root = validate_root(params['root'])
        self.config_dir = validate_root(params['config_dir'], 'config_dir')
        systemctl_path = shutil.which('systemctl')
        self.systemctl = Systemctl(systemctl_path) if systemctl_path and systemd_is_pid1() else None
        # What the plan found worth saying without refusing (devices: all leaving out GPUs in MIG mode).
        self.plan_warnings: t.List[str] = []

    # --- validation --------------------------------------------------------------------------------
    def _setup(self, name: str, state: str, plan: t.Optional[ResourcePlan]) -> DaemonSetup:
        p = self.params
        values = dict(root=self.root, config_dir=self.config_dir, control_binary=p['control_binary'], name=name, state=state,
                      devices=[gpu.uuid for gpu in plan.devices] if plan else 'all', multiuser=plan.multiuser if plan else False,
                      compute_mode=p['compute_mode'], supervisor=p['supervisor'], start_timeout=p['start_timeout'],
                      stop_timeout=p['stop_timeout'], busy=p['busy'], busy_timeout=p['busy_timeout'], log_mode=p['log_mode'],
                      shm=p['shm'], container_root=p['container_root'], selinux_type=p['selinux_type'])
        try:
            return DaemonSetup.from_params(values, self.binary)
        except InvalidParameterError as exc:
            if plan is not None and exc.param == 'name':
                raise InvalidParameterError('resources[%d].name' % [r['name'] for r in p['resources']].index(name), exc.msg) from exc
            raise

    def validate(self, gpus: t.Sequence[Gpu]) -> t.Tuple[t.List[_Resource], t.List[_Resource]]:
        """(listed resources, resources to remove), every option checked; nothing read from a daemon, nothing changed."""
        p = self.params
        plans = plan_resources(p['resources'], gpus, 'resources', warnings=self.plan_warnings) if p['state'] == 'present' else []
        if p['state'] == 'present':
            if p['shm']:
                size_kib(p['shm_size'], param='shm_size')
            if p['health_check'] and (p['health_interval'] < 5 or p['health_timeout'] < 1):
                raise InvalidParameterError('health_interval', 'the health check needs an interval of at least 5 s and a timeout '
                                            'of at least 1 s; got %d and %d' % (p['health_interval'], p['health_timeout']))
            if p['logrotate']:
                try:
                    render_logrotate(self.root, p['logrotate_size'], p['logrotate_rotate'])
                except MpsError as exc:
                    raise InvalidParameterError('logrotate_size', exc.msg) from exc
        listed = [_Resource(plan.name, self._setup(plan.name, 'started', plan), plan) for plan in plans]
        names = {plan.name for plan in plans}
        removed = []
        if p['state'] == 'absent' or p['prune']:
            with_logs = p['state'] == 'absent' and p['remove_logs']
            for name in sorted(set(scan_resources(self.root, with_logs)) | set(scan_config(self.config_dir))):
                if name not in names:
                    removed.append(_Resource(name, self._setup(name, 'absent', None)))
        return listed, removed

    # --- planning and applying ---------------------------------------------------------------------
    def _manager(self, res: _Resource, check_mode: bool, ignore: t.FrozenSet[str]) -> ResourceManager:
        manager = res.setup.manager(self.nvml, check_mode)
        manager.ignore_owners = ignore
        return manager

    def _limits(self, res: _Resource, check_mode: bool) -> t.Any:
        plan = res.plan
        if plan is None:
            raise MpsError('internal error: limits of the removed resource %s were asked for' % res.name)
        running = inspect(res.setup.paths).running
        manager = LimitsManager(res.setup.paths, res.setup.config, res.setup.daemon if running else None, self.nvml.gpus(),
                                check_mode)
        manager.exact = True
        manager.planned = list(plan.devices)
        return manager.ensure(plan.active_thread_percentage, plan.pinned_device_mem_limit, plan.replicas, 'ignore', True, True)

    def _daemon(self, res: _Resource, state: str, check_mode: bool, ignore: t.FrozenSet[str]) -> t.Any:
        p = self.params
        manager = self._manager(res, check_mode, ignore)
        manager.restart_reason = res.limits.restart_needed if res.limits is not None else ''
        if res.plan is None:
            # A pruned resource keeps its logs; a teardown removes them when asked to.
            return manager.ensure('absent', 'all', False, p['compute_mode'], False, False,
                                  remove_logs=p['remove_logs'] and p['state'] == 'absent')
        return manager.ensure(state, [gpu.uuid for gpu in res.plan.devices], res.plan.multiuser, p['compute_mode'], True,
                              p['shm'], foreground=p['foreground'])

    def ensure(self, gpus: t.Sequence[Gpu]) -> HostOutcome:
        listed, removed = self.validate(gpus)
        ignore = frozenset(res.name for res in listed + removed)
        p = self.params
        refuse_unsafe_dirs([(self.root, 'root'), (self.config_dir, 'config_dir')])
        withdraw = p['ready'] and not self.check_mode and p['state'] == 'present'
        try:
            out = self._plan(listed, removed, ignore)
        except (DaemonTimeoutError, ControlBinaryError):
            # A daemon that does not answer (sanely) is not healthy: the mark goes, nothing else was changed.
            if withdraw:
                remove(os.path.join(self.root, READY_FILE))
            raise
        # Any other refusal of the plan (a busy daemon, a GPU another root's daemon serves) changed nothing: the
        # daemons are as healthy as before, and the mark stays as it was.
        try:
            if not self.check_mode and out.changed:
                out = self._apply(listed, removed, ignore)
            self._finish(listed, out)
        except MpsError:
            # A half-applied run must not leave the root marked ready.
            if withdraw:
                remove(os.path.join(self.root, READY_FILE))
            raise
        out.ui_processes = sum(res.setup.daemon.client.processes for res in listed + removed)
        out.warnings[:0] = self.plan_warnings
        return out

    def _plan(self, listed: t.List[_Resource], removed: t.List[_Resource], ignore: t.FrozenSet[str]) -> HostOutcome:
        """Every action of the run, in check mode: nothing is changed here."""
        return self._run(listed, removed, ignore, check_mode=True)

    def _apply(self, listed: t.List[_Resource], removed: t.List[_Resource], ignore: t.FrozenSet[str]) -> HostOutcome:
        """The planned change; each step reads the state again under its locks."""
        return self._run(listed, removed, ignore, check_mode=False)

    def _run(self, listed: t.List[_Resource], removed: t.List[_Resource], ignore: t.FrozenSet[str], check_mode: bool) -> HostOutcome:
        """The run's steps in the order that always works: planned (check_mode) or applied, step by step."""
        out = HostOutcome()
        absent = self.params['state'] == 'absent'
        if absent:
            # The health timer first: it would write the mark back while the daemons are still answering.
            first = HostOutcome()
            self._health(first, False)
            self._withdraw_ready(first, 'state=absent')
            if not check_mode:
                first.apply()
            out.take('host', first)
        else:
            self._shm(out, check_mode)
        for res in removed:
            out.take(res.name, self._daemon(res, 'absent', check_mode, ignore))
            out.removed.append(res.name)
        if absent:
            self._shm(out, check_mode)
        if not check_mode:
            # The plan's restarts become a stop of every one of them before any start: GPU moves and swaps.
            for res in listed:
                if res.restart:
                    stopped = self._daemon(res, 'stopped', False, ignore)
                    res.gone = list(stopped.gone)
                    out.take(res.name, stopped)
                    res.setup.daemon.answered = False
        for res in listed:
            res.limits = self._limits(res, check_mode)
            if check_mode:
                res.restart = bool(res.limits.restart_needed)
            res.daemon = self._daemon(res, 'restarted' if check_mode and res.restart else 'started', check_mode, ignore)
            if check_mode:
                res.restart = res.daemon.restarting
            out.take(res.name, res.limits)
            out.take(res.name, res.daemon)
        out.steps = []  # applied by each manager already, or never (the plan)
        return out

    def _shm(self, out: HostOutcome, check_mode: bool) -> None:
        p = self.params
        absent = p['state'] == 'absent'
        if not (p['shm'] or absent):
            return
        manager = ShmManager.for_host(self.root, 'absent' if absent else 'mounted', p['shm_persist'], '/etc/fstab', self.unit_dir,
                                      check_mode, p['selinux_type'], param='shm_persist')
        persisted = manager._persisted()
        if absent and not os.path.isdir(manager.given_path) and not persisted['fstab'] and not persisted['unit']:
            return
        # The plan stops every daemon of the root before the unmount; the real run checks again then.
        manager.daemons_stop_first = absent and check_mode
        shm = manager.ensure('absent' if absent else 'mounted', p['shm_size'])
        out.take('shm', shm)

    # --- the files around the daemons ---------------------------------------------------------------
    def _write(self, out: HostOutcome, path: str, text: str, mode: int, why: str) -> bool:
        if read_text(path) == text and _mode(path) == mode:
            return False
        out.act('write %s' % path, None if self.check_mode else (lambda: atomic_write(path, text, mode)), why)
        return True

    def _remove(self, out: HostOutcome, path: str, why: str) -> bool:
        if not os.path.lexists(path):
            return False
        out.act('remove %s' % path, None if self.check_mode else (lambda: remove(path)), why)
        return True

    def _withdraw_ready(self, out: HostOutcome, why: str) -> None:
        if self.params['ready']:
            self._remove(out, os.path.join(self.root, READY_FILE), why)

    def _finish(self, listed: t.List[_Resource], out: HostOutcome) -> None:
        """Health of every listed daemon, the ready mark, the health check, log rotation, local facts."""
        p = self.params
        present = p['state'] == 'present'
        after = HostOutcome()
        for res in listed:
            out.resources.append(self._result(res, out))
        if present:
            out.ready = not out.unhealthy
            ready = os.path.join(self.root, READY_FILE)
            if p['ready'] and out.ready:
                if not os.path.exists(ready):
                    def mark() -> None:
                        ensure_dir(self.root, 0o755)
                        atomic_write(ready, '', 0o644)
                    after.act('write %s' % ready, None if self.check_mode else mark, 'every listed daemon answers')
            elif p['ready']:
                self._remove(after, ready, 'not healthy: %s' % ', '.join(sorted(out.unhealthy)))
        if present:
            self._health(after, bool(listed))
        drop_in = os.path.join(p['logrotate_dir'], LOGROTATE_FILE)
        if present and p['logrotate'] and os.path.isdir(p['logrotate_dir']):
            self._write(after, drop_in, render_logrotate(self.root, p['logrotate_size'], p['logrotate_rotate']), 0o644,
                        'rotate the daemons\' logs (copytruncate)')
        elif os.path.isdir(p['logrotate_dir']):
            self._remove(after, drop_in, 'state=absent' if not present else 'logrotate=false')
        fact = os.path.join(p['local_facts_dir'], FACT_FILE) if p['local_facts_dir'] else None
        if fact and present and p['local_facts']:
            out.facts = local_facts([res.plan.as_dict() for res in listed if res.plan], out.resources,
                                    [gpu.facts() for gpu in self.nvml.gpus()], self.root)
            if not self.check_mode:
                after.step(lambda: ensure_dir(p['local_facts_dir'], 0o755))
            self._write(after, fact, facts_text(out.facts), 0o644, 'local facts for schedulers and later plays')
        elif fact:
            self._remove(after, fact, 'state=absent' if not present else 'local_facts=false')
        if not present and p['remove_logs']:
            after.step(lambda: _rmdir_if_empty(self.root))
        out.take('host', after)
        if not self.check_mode:
            after.apply()
        if present and out.unhealthy:
            raise MpsError('MPS daemons not healthy: %s (see %s/<resource>/log)' % (
                '; '.join('%s: %s' % item for item in sorted(out.unhealthy.items())), self.root), unhealthy=out.unhealthy)

    def _health(self, out: HostOutcome, wanted_here: bool) -> None:
        """The health timer that keeps the ready mark true between runs, where systemd supervises the daemons."""
        p = self.params
        files = render_health(self.root, self.config_dir, self.unit_dir, p['health_interval'], p['health_timeout'])
        timer = os.path.join(self.unit_dir, HEALTH_TIMER)
        wanted = (wanted_here and p['health_check'] and p['supervisor'] != 'none' and p['ready'] and self.systemctl is not None)
        systemctl = self.systemctl
        if wanted and systemctl is not None:
            written = False
            for path, text in files.items():
                written = self._write(out, path, text, 0o644 if path.startswith(self.unit_dir) else 0o755,
                                      'the health check keeps %s/.ready true between runs' % self.root) or written
            if written:
                out.step(systemctl.daemon_reload)
            if written or not systemctl.is_enabled(HEALTH_TIMER):
                out.act('enable %s' % HEALTH_TIMER, lambda: systemctl.enable(HEALTH_TIMER))
            if written or not systemctl.is_active(HEALTH_TIMER):
                out.act('start %s' % HEALTH_TIMER, lambda: systemctl.restart(HEALTH_TIMER))
        elif os.path.exists(timer):
            if systemctl is not None:
                out.act('stop and disable %s' % HEALTH_TIMER, lambda: (systemctl.stop(HEALTH_TIMER), systemctl.disable(HEALTH_TIMER)))
            for path in files:
                self._remove(out, path, 'the health check does not belong here (any more)')
            if systemctl is not None:
                out.step(systemctl.daemon_reload)

    def _result(self, res: _Resource, out: HostOutcome) -> t.Dict[str, t.Any]:
        """The resource as it is after the run: its daemon, its limits, whether it answers."""
        paths = res.setup.paths
        state = inspect(paths)
        healthy = False
        reason = ''
        if self.check_mode:
            healthy = state.running or bool(res.daemon and res.daemon.changed)
        elif state.running:
            try:
                if not res.setup.daemon.answered:
                    res.setup.daemon.ping()
                healthy = True
            except MpsError as exc:
                reason = exc.msg
        else:
            reason = 'not running'
        if not healthy and not self.check_mode:
            out.unhealthy[res.name] = reason or 'not running'
        limits = res.limits
        return {
            'name': res.name,
            'pid': state.pid if state.running else (res.daemon.pid if res.daemon else None),
            'running': state.running,
            'healthy': healthy,
            'devices': [dict(gpu.summary(), ordinal=ordinal) for ordinal, gpu in enumerate(res.plan.devices)] if res.plan else [],
            'multiuser': res.plan.multiuser if res.plan else False,
            'replicas': res.plan.replicas if res.plan else None,
            'env': paths.client_env(),
            'container': res.setup.container,
            'limits': {'persisted': persisted_facts(read_persisted(res.setup.config)), 'commands': limits.commands if limits else [],
                       'pending': limits.pending if limits else []},
            'restarted': res.restart,
            'changed': bool((res.daemon and res.daemon.changed) or (limits and limits.changed)),
            'actions': (limits.actions if limits else []) + (res.daemon.actions if res.daemon else []),
            'started_at': res.daemon.started_at if res.daemon else None,
            'notes': list(res.daemon.notes) if res.daemon else [],
            'gone': res.gone + [item for item in (res.daemon.gone if res.daemon else []) if item not in res.gone],
            'diff': {'before': dict(res.daemon.before if res.daemon else {}, limits=limits.before if limits else None),
                     'after': dict(res.daemon.after if res.daemon else {}, limits=limits.after if limits else None)},
        }


def _mode(path: str) -> t.Optional[int]:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return None


def _rmdir_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
