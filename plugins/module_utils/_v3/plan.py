# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A v3 resource's part of a host plan, in the place a legacy resource's limits take: its TOML file kept equal to its
record, and its running server's namespaces changed live - or the reason only a new start can change them.

Decided from the run's view alone (the file as read, the server as listed); check mode returns the plan, a real run
executes exactly it. MPS does not persist a live change [ref 1.10]: the file is rewritten with it, so that a restart or a
boot brings the same namespaces back.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from .._errors import InvalidParameterError, MpsError
from .._io import atomic_write, ensure_dir, remove, restorer
from .._observe.reader import V3_HELP_WORD
from .._outcome import Outcome
from .control import send, wait_namespace_idle
from .decide import LiveChange, live_changes
from .spec import V3Spec


@dataclass
class V3Outcome(Outcome):
    """What a v3 resource's plan does, shaped as a legacy resource's limits outcome for the host plan (no persisted
    limits, no replay: the daemon applies its file at start)."""

    restart_needed: str = ''
    wanted: t.Any = None
    replay_for: t.Any = None
    pending: t.List[str] = field(default_factory=list)
    commands: t.List[str] = field(default_factory=list)
    # The plan as it stands when the daemon restarts instead: only the file (the new daemon applies it).
    on_restart: t.Optional['V3Outcome'] = None

    def restarted(self) -> 'V3Outcome':
        return self.on_restart if self.on_restart is not None else self


@dataclass(frozen=True)
class V3Run:
    """What a v3 plan is given: the record, the resource's name and files, its daemon's UI client, busy."""

    spec: V3Spec
    name: str
    config: t.Any  # _resource.layout.ConfigPaths
    client: t.Any  # _protocol.framing.ControlClient
    busy: str
    busy_timeout: int
    sleep: t.Callable[[float], None]


def _file(run: V3Run, view: t.Any, out: V3Outcome) -> None:
    config = run.config
    for legacy in (config.limits_file, config.limits_json, config.limits_env):
        # A legacy resource's persisted limits and their replay: a v3 daemon would be sent legacy words at start.
        if view.paths.lexists(legacy):
            change = out.act('remove %s' % legacy, lambda legacy=legacy: remove(legacy),
                             reason='the resource runs MPS v3: its limits are in %s' % config.v3_config)
            change.undo = restorer(legacy, (view.text(legacy), view.mode(legacy)))
    text = run.spec.toml()
    current = view.text(config.v3_config, 'the MPS v3 configuration of %s' % run.name)
    if current == text:
        return

    def write() -> None:
        ensure_dir(config.config_dir, 0o755)
        atomic_write(config.v3_config, text, 0o644)

    change = out.act('write %s' % config.v3_config, write,
                     reason='its daemon applies it at every start (-a)' if current is None else 'the resource\'s entry changed')
    change.undo = restorer(config.v3_config, (current, view.mode(config.v3_config)))


def plan_v3(run: V3Run, view: t.Any, *, check_mode: bool) -> V3Outcome:
    """The file, then each live change of the running server (busy deciding about attached clients)."""
    out = V3Outcome()
    out.on_restart = V3Outcome()
    _file(run, view, out)
    _file(run, view, out.on_restart)
    spec = run.spec
    found = view.v3.get(run.name)
    out.after = {'v3': {'server': spec.server, 'default': spec.default.as_dict(),
                        'namespaces': {name: limits.as_dict() for name, limits in spec.namespaces}}}
    if found is None:
        return out  # not running: the start applies the file
    seen = found[1]
    out.before = {'v3': {'server': seen.server, 'default': seen.namespaces['default'].as_dict() if 'default' in seen.namespaces else None,
                         'namespaces': {name: limits.as_dict() for name, limits in seen.namespaces.items() if name != 'default'}}}
    if seen.server != spec.server:
        out.restart_needed = 'server: %s -> %s' % (seen.server, spec.server)
        return out
    changes, reason = live_changes(spec, seen)
    if reason:
        out.restart_needed = reason
        return out
    for change in changes:
        _live(run, change, out, check_mode=check_mode)
    return out


def set_up(setup: t.Any, spec: V3Spec) -> None:
    """A listed v3 resource's setup (_daemon.manager.DaemonSetup): its daemon asked with v3 words about its server, its
    container view pointed at the server."""
    setup.daemon.v3_server = spec.server
    if setup.container is not None:
        from .._container import with_engine  # pylint: disable=import-outside-toplevel
        view = {key: value for key, value in setup.container.items() if key != 'engine'}
        setup.container = with_engine(spec.container(view, setup.paths.pipe_dir))


def plan_for_host(name: str, spec: V3Spec, setup: t.Any, params: t.Mapping[str, t.Any], view: t.Any, *,
                  check_mode: bool) -> V3Outcome:
    """mps_host's plan of a v3 resource, in the place of a legacy one's limits; refused where the binary has no v3 (its
    help, read once in the view)."""
    daemon = setup.daemon
    offered = view.offers(daemon.binary, V3_HELP_WORD)
    if offered is not True:
        raise InvalidParameterError('protocol', '3 needs MPS v3 (driver r615, CUDA 13.4, and later), and the help of '
                                    '"%s -p 3 -h" lists no server module: this binary has no MPS v3%s. Nothing was '
                                    'changed' % (daemon.binary, '' if offered is False else ' (or its help could not be read)'))
    run = V3Run(spec, name, setup.config, daemon.client, params['busy'], params['busy_timeout'], daemon.sleep)
    return plan_v3(run, view, check_mode=check_mode)


def _live(run: V3Run, change: LiveChange, out: V3Outcome, *, check_mode: bool) -> None:
    spec = run.spec
    text = change.describe(spec.server)
    pids = ', '.join('pid %d' % pid for pid in change.attached)
    if change.touches_clients:
        what = ('%s would end them' % ('the delete' if change.verb == 'delete' else 'making it anew') if change.verb != 'set'
                else 'a namespace\'s limits cannot be set while a client is attached')
        if run.busy == 'refuse':
            raise MpsError('busy: %s - %d attached client(s) (%s): %s; nothing was done. Set busy=wait to wait up to '
                           'busy_timeout seconds for them to leave, or busy=terminate to end them' % (
                               text, len(change.attached), pids, what),
                           clients=[{'pid': pid, 'namespace': change.namespace, 'server': spec.server} for pid in change.attached])
        if run.busy == 'wait':
            out.act('wait up to %ds for %d client(s) of namespace %s of server %s to leave - %s' % (
                run.busy_timeout, len(change.attached), change.namespace, spec.server, pids),
                lambda: wait_namespace_idle(run.client, spec.server, change.namespace, run.busy_timeout, run.sleep, run.name))
        else:
            out.warnings.append('%s %s %d attached client(s) of namespace %s (busy=terminate) - %s' % (
                text, 'would end' if check_mode else 'ends', len(change.attached), change.namespace, pids))
    force = change.touches_clients and run.busy == 'terminate'
    commands = change.commands(spec.server, force=force)
    if force and change.verb == 'set':
        commands = [['client', 'terminate', str(pid)] for pid in change.attached] + commands
    out.commands += [' '.join(words) for words in commands]

    def apply() -> None:
        for words in commands:
            send(run.client, words, run.name)

    out.act(text, apply, kind='limits', ends_clients=force)
