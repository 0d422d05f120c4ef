# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files around a host's daemons, planned as changes: the ready mark, the health timer, log rotation, local facts.

The ready mark is the one a scheduler trusts: a plan that brings any resource down withdraws it as its first
change, and writes it as its last, only when every listed resource answers (an empty list is not ready).
"""

from __future__ import annotations

import os
import re
import typing as t

from .._bytecode import CACHE_DIR as BYTECODE_DIR, remove_bytecode
from .._errors import InvalidParameterError, MpsError
from .._io import atomic_write, ensure_dir, read_text, remove
from .._observe.reader import Wants, env_server
from .._observe.view import HostView
from .._outcome import Outcome
from .._resource.layout import config_paths, resource_paths
from .._supervisor.health import HEALTH_NAME, METRICS_FILE, render_health
from .._supervisor.logrotate import render_logrotate
from .._supervisor.unit import MANAGED_HEADER as SLURM_MANAGED, Systemctl
from .facts import FACT_FILE

READY_FILE = '.ready'
LOGROTATE_FILE = 'gpufleet-mps'
HEALTH_TIMER = HEALTH_NAME + '.timer'
HEALTH_SERVICE = HEALTH_NAME + '.service'


def plan_write(out: Outcome, path: str, text: str, mode: int, why: str, view: HostView, what: str = 'a file') -> bool:
    """Plan writing ``text`` to ``path`` unless it is there already, with ``mode`` (as ``view`` read it)."""
    if view.text(path, what) == text and view.mode(path) == mode:
        return False
    out.act('write %s' % path, lambda: (ensure_dir(os.path.dirname(path), 0o755), atomic_write(path, text, mode)), why)
    return True


def plan_remove(out: Outcome, path: str, why: str, view: HostView, what: str = 'a file') -> bool:
    """Plan removing the file ``path`` where ``view`` found one; a directory there is refused, naming ``what`` it should be."""
    if not view.paths.lexists(path):
        return False
    view.paths.require_absent_or(path, 'file', what)
    out.act('remove %s' % path, lambda: remove(path), why)
    return True


def _slurm_managed(text: str) -> bool:
    """A Slurm file this collection wrote: its header says so (_supervisor/slurm.py MANAGED, in its first lines)."""
    return any(SLURM_MANAGED in line for line in text.split('\n')[:3])


def _metrics_dir(script: t.Optional[str]) -> t.Optional[str]:
    """Where a health check script writes its metrics (None: nowhere)."""
    found = re.search(r"^metrics_dir='([^'\n]+)'$", script or '', re.M)
    return found.group(1) if found else None


def check_paths(params: t.Mapping[str, t.Any]) -> None:
    """The paths of the files written around the daemons: absolute, or a relative one would be written under whatever
    directory the module runs in, and never found again."""
    for param in ('logrotate_dir', 'local_facts_dir', 'metrics_dir', 'slurm_task_prolog', 'slurm_gres_conf',
                  'slurm_device_dir'):
        if params.get(param) and not os.path.isabs(params[param]):
            raise InvalidParameterError(param, '%r is not an absolute path' % params[param])


def check_around(params: t.Mapping[str, t.Any], root: str, *, systemd: bool) -> None:
    """The other options of the files around the daemons (state=present), each refusal naming the option the user
    wrote; ``systemd``: whether systemd runs the daemons here."""
    p = params
    if p['health_check']:
        if p['health_interval'] < 5:
            raise InvalidParameterError('health_interval', 'the health check needs an interval of at least 5 s; got %d'
                                        % p['health_interval'])
        if p['health_timeout'] < 1:
            raise InvalidParameterError('health_timeout', 'the health check needs a timeout of at least 1 s; got %d'
                                        % p['health_timeout'])
    if p['logrotate']:
        if isinstance(p['logrotate_rotate'], bool) or p['logrotate_rotate'] < 0:
            raise InvalidParameterError('logrotate_rotate', 'must be a number of old logs to keep, at least 0; got %r'
                                        % (p['logrotate_rotate'],))
        try:
            render_logrotate(root, p['logrotate_size'], p['logrotate_rotate'])
        except MpsError as exc:
            raise InvalidParameterError('logrotate_size', exc.msg.replace('size: ', '', 1)) from exc
    if p.get('metrics_dir'):
        why = ('health_check is false' if not p['health_check'] else 'ready is false' if not p['ready'] else
               'the daemons here run with supervisor=%s' % p['supervisor'] if p['supervisor'] == 'none' else
               'systemd is not running here (supervisor=auto)' if not systemd else '')
        if why:
            raise InvalidParameterError('metrics_dir', 'nothing would write %s: the metrics are written by the health check, '
                                        'a systemd timer that runs with health_check=true and ready=true, and %s. '
                                        'Leave metrics_dir unset here' % (p['metrics_dir'], why))


class Around:
    """Plans the host's files around the daemons; every change through ``out.act``, nothing written here."""

    def __init__(self, params: t.Mapping[str, t.Any], root: str, config_dir: str, unit_dir: str,
                 systemctl: t.Optional[Systemctl]) -> None:
        self.params = params
        self.root = root
        self.config_dir = config_dir
        self.unit_dir = unit_dir
        self.systemctl = systemctl
        self.ready_path = os.path.join(root, READY_FILE)
        self.bytecode_path = os.path.join(root, BYTECODE_DIR)
        # The run's view of the host, which every file compared here is read from.
        self.view: HostView = HostView()

    def _health_files(self) -> t.Dict[str, str]:
        p = self.params
        return render_health(self.root, self.config_dir, self.unit_dir, p['health_interval'], p['health_timeout'],
                             metrics_dir=p.get('metrics_dir') or None, v3=self._v3_here())

    def _v3_here(self) -> bool:
        """A resource of the host runs MPS v3 - listed so, or found so (an unlisted one kept with prune=false: its record,
        or its environment file, names its server): its daemon is asked with v3 words (else the scripts stay byte for byte)."""
        p = self.params
        if p.get('state') == 'absent':
            return False
        if any(str(entry.get('protocol') or p.get('protocol') or 'legacy') == '3'
               for entry in p.get('resources') or [] if isinstance(entry, dict)):
            return True
        view = self.view
        for name, seen in view.resources.items():
            if (seen.record is not None and seen.record.protocol == 3) or env_server(view, config_paths(self.config_dir, name)):
                return True
        return False

    def _old_metrics(self, wanted_dir: t.Optional[str]) -> t.Optional[str]:
        """The textfile an earlier health script wrote, where this run's writes none or another one: it goes too."""
        found = _metrics_dir(self.view.text(next(iter(self._health_files())), 'the health check script'))
        if not found or (wanted_dir and os.path.normpath(wanted_dir) == found):
            return None
        return os.path.join(found, METRICS_FILE)

    def _drop_in(self) -> str:
        return os.path.join(self.params['logrotate_dir'], LOGROTATE_FILE)

    def _fact(self) -> t.Optional[str]:
        return os.path.join(self.params['local_facts_dir'], FACT_FILE) if self.params['local_facts_dir'] else None

    def _slurm_files(self) -> t.List[str]:
        p = self.params
        return [path for path in (p.get('slurm_task_prolog'), p.get('slurm_gres_conf')) if path]

    def wants(self) -> Wants:
        """Every path this plans from: the files it compares with what it would write, the directories it checks."""
        p = self.params
        wants = Wants().add(files=list(self._health_files()) + [self._drop_in(), self._fact()] + self._slurm_files(),
                            dirs=[p['logrotate_dir'], p.get('metrics_dir') or None],
                            others=[self.ready_path, os.path.join(self.unit_dir, HEALTH_TIMER), self.bytecode_path])
        # The textfile an earlier health script names (it may have to go): read now, to know which path to look at.
        try:
            old = _metrics_dir(read_text(next(iter(self._health_files()))))
        except OSError:
            old = None  # not a file: the decision refuses it, naming it
        return wants.add(others=[os.path.join(old, METRICS_FILE)] if old else [])

    def _slurm_resources(self, entries: t.Sequence[t.Any]) -> t.List[t.Dict[str, t.Any]]:
        """The listed resources (_host.entries.ResourceEntry) as the Slurm hook renders them: their directories and GPUs in the
        daemon's order; resources on MIG devices left out (Slurm describes MIG devices itself)."""
        found = []
        for entry in entries:
            if any(gpu.is_mig for gpu in entry.devices):
                continue
            paths = resource_paths(self.root, entry.name)
            item = {'name': entry.name, 'pipe_dir': paths.pipe_dir, 'log_dir': paths.log_dir,
                    'devices': [{'index': gpu.index, 'uuid': gpu.uuid, 'memory_total_mib': gpu.memory_total_mib}
                                for gpu in entry.devices]}
            if entry.v3 is not None:
                # MPS v3: jobs are pointed at the server, never at <pipe>, whose main socket routes to uid_<uid> [ref 1.9]
                item['client_pipe_dir'] = entry.v3.pipe_dir(paths.pipe_dir)
            found.append(item)
        return found

    def slurm(self, out: Outcome, entries: t.Optional[t.Sequence[t.Any]]) -> None:
        """Slurm's TaskProlog and gres.conf from the listed resources (``entries``: None when the hook is not wanted).

        Without the hook (or at teardown) a file at those paths is removed only when this collection wrote it (its
        header says so): an administrator's own gres.conf - or whatever else is there - is never touched.
        """
        p = self.params
        paths = [(param, p.get(param)) for param in ('slurm_task_prolog', 'slurm_gres_conf') if p.get(param)]
        if entries is None:
            for param, path in paths:
                if self.view.paths.isdir(path) or not self.view.paths.exists(path):
                    continue
                if _slurm_managed(self.view.text(path, 'the Slurm file %s names' % param)):
                    plan_remove(out, path, 'slurm_hook=false' if p['state'] == 'present' else 'state=absent', self.view)
            return
        # Imported here: only hosts with the Slurm hook compile it (AnsiballZ compiles every module imported, on every run).
        from .._supervisor.slurm import render_gres_conf, render_task_prolog  # pylint: disable=import-outside-toplevel
        resources = self._slurm_resources(entries)
        for param, path in paths:
            text = self.view.text(path, 'the Slurm file %s names' % param)
            if text is not None and not _slurm_managed(text):
                raise InvalidParameterError(param, '%s exists and was not written by this collection: it is never '
                                            'overwritten; move it away, or set %s to another path (or to "" for none)'
                                            % (path, param))
        prolog, gres = p.get('slurm_task_prolog'), p.get('slurm_gres_conf')
        if prolog:
            plan_write(out, prolog, render_task_prolog(self.root, resources, memory_share=bool(p.get('slurm_memory_share'))), 0o755,
                       'Slurm MPS jobs are pointed at the daemon of their GPU', self.view, 'a Slurm TaskProlog (slurm_task_prolog)')
        if gres:
            plan_write(out, gres, render_gres_conf(resources, p.get('slurm_device_dir') or '/dev'), 0o644,
                       'Slurm offers the GPUs the daemons serve as mps shares', self.view, 'a Slurm gres.conf (slurm_gres_conf)')

    def ready_exists(self) -> bool:
        """Observed: whether the ready mark is there (a directory there is refused: the mark is an empty file)."""
        return self.view.paths.lexists(self.ready_path)

    def drop_bytecode(self, out: Outcome) -> None:
        """A teardown removes the modules' bytecode cache (_bytecode.py): its entries, then the directory."""
        if self.view.paths.lexists(self.bytecode_path):
            out.act('remove %s (the modules\' bytecode cache)' % self.bytecode_path, lambda: remove_bytecode(self.bytecode_path))

    def withdraw_ready(self, out: Outcome, why: str) -> None:
        """The mark removed (decided by :func:`.decide.decide_ready`)."""
        self.view.paths.require_absent_or(self.ready_path, 'file', 'the ready mark (an empty file)')
        out.act('remove %s' % self.ready_path, lambda: remove(self.ready_path), why)

    def mark_ready(self, out: Outcome, check: t.Callable[[], None]) -> None:
        """The mark, last: ``check`` (every listed daemon answers) runs first and raises when one does not."""
        self.view.paths.require_absent_or(self.ready_path, 'file', 'the ready mark (an empty file)')

        def mark() -> None:
            check()
            ensure_dir(self.root, 0o755)
            atomic_write(self.ready_path, '', 0o644)
        out.act('write %s' % self.ready_path, mark, 'every listed daemon answers', kind='ready')

    def _stop_health(self, systemctl: Systemctl) -> None:
        """The timer stopped, then a check it started that is still running: stopping a timer leaves its service
        running, and a check that asked the daemons before they went down would write the mark after it was withdrawn."""
        systemctl.stop(HEALTH_TIMER)
        systemctl.stop(HEALTH_SERVICE)

    def pause_health(self, out: Outcome) -> bool:
        """Stop the health timer, and a check in progress, while this run brings daemons down (the run writes the mark
        itself once they answer, and :meth:`health` starts the timer again). False where no timer runs here."""
        systemctl = self.systemctl
        if systemctl is None or not self.view.unit(HEALTH_TIMER)[0]:
            return False
        out.act('stop %s' % HEALTH_TIMER, lambda: self._stop_health(systemctl),
                'a check would write %s back while daemons go down; started again after them' % self.ready_path, kind='unit')
        return True

    def health(self, out: Outcome, *, wanted_here: bool, paused: bool = False) -> None:
        """The health timer that keeps the ready mark true between runs, where systemd supervises the daemons;
        ``paused``: :meth:`pause_health` stopped it earlier in this run."""
        p = self.params
        files = self._health_files()
        timer = os.path.join(self.unit_dir, HEALTH_TIMER)
        systemctl = self.systemctl
        wanted = wanted_here and p['health_check'] and p['supervisor'] != 'none' and p['ready'] and systemctl is not None
        stale = self._old_metrics(p.get('metrics_dir') if wanted else None)
        if stale:
            plan_remove(out, stale, 'the health check writes its metrics %s now' % (
                'to %s' % p['metrics_dir'] if wanted and p.get('metrics_dir') else 'nowhere'), self.view)
        if wanted and systemctl is not None:
            metrics_dir = p.get('metrics_dir')
            if metrics_dir and not self.view.paths.isdir(metrics_dir):
                out.act('create %s' % metrics_dir, lambda: ensure_dir(metrics_dir, 0o755),
                        'the health check writes its metrics for node_exporter there')
            written = False
            for path, text in files.items():
                written = plan_write(out, path, text, 0o644 if path.startswith(self.unit_dir) else 0o755,
                                     'the health check keeps %s true between runs' % self.ready_path, self.view,
                                     'a file of the health check') or written
            active, enabled = self.view.unit(HEALTH_TIMER)
            if written:
                out.step(systemctl.daemon_reload)
            if written or not enabled:
                out.act('enable %s' % HEALTH_TIMER, lambda: systemctl.enable(HEALTH_TIMER))
            if written or not active or paused:
                out.act('start %s' % HEALTH_TIMER, lambda: systemctl.restart(HEALTH_TIMER),
                        'the daemons this run brought down are up again' if paused and not written and active else None, kind='unit')
        elif self.view.paths.exists(timer):
            if systemctl is not None:
                out.act('stop and disable %s' % HEALTH_TIMER, lambda: (self._stop_health(systemctl), systemctl.disable(HEALTH_TIMER)),
                        'no health check is wanted here; a check in progress is stopped too', kind='unit')
            for path in files:
                plan_remove(out, path, 'the health check does not belong here (any more)', self.view)
            if systemctl is not None:
                out.step(systemctl.daemon_reload)

    def logrotate(self, out: Outcome, *, present: bool) -> None:
        p = self.params
        drop_in = self._drop_in()
        if present and p['logrotate'] and self.view.paths.isdir(p['logrotate_dir']):
            plan_write(out, drop_in, render_logrotate(self.root, p['logrotate_size'], p['logrotate_rotate']), 0o644,
                       'rotate the daemons\' logs (copytruncate)', self.view, 'a logrotate drop-in')
        elif self.view.paths.isdir(p['logrotate_dir']):
            plan_remove(out, drop_in, 'state=absent' if not present else 'logrotate=false', self.view)

    def local_facts(self, out: Outcome, text: t.Optional[str]) -> None:
        """``text`` is the facts file planned (None: no facts wanted)."""
        p = self.params
        fact = self._fact()
        if fact and text is not None:
            plan_write(out, fact, text, 0o644, 'local facts for schedulers and later plays', self.view,
                       'the local facts file (a JSON file)')
        elif fact:
            plan_remove(out, fact, 'state=absent' if p['state'] != 'present' else 'local_facts=false', self.view,
                        'the local facts file (a JSON file)')
