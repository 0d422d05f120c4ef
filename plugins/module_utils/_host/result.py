# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What mps_host returns for each listed resource: as observed after the run, or (check mode) as planned."""

from __future__ import annotations

import typing as t

from .._errors import MpsError
from .._limits.store import persisted_facts
from .._supervisor.liveness import inspect


def planned_resource(res: t.Any) -> t.Dict[str, t.Any]:
    """The resource as the plan leaves it (for the local facts the plan writes): up, with the limits it persists."""
    wanted = res.limits.wanted if res.limits is not None else None
    found = {'name': res.name, 'healthy': True, 'env': client_env(res),
             'limits': {'persisted': None if wanted is None or wanted.empty else persisted_facts(wanted)}}
    v3 = res.entry.v3 if res.entry is not None else None
    if v3 is not None:
        found['v3'] = v3.as_dict(res.setup.paths.pipe_dir)
    return found


def client_env(res: t.Any) -> t.Dict[str, str]:
    """What a client of the resource sets: a v3 resource's points at its server, never at the pipe directory itself (whose
    main socket routes a client to an automatic server outside the resource's limits)."""
    env = res.setup.paths.client_env()
    v3 = res.entry.v3 if res.entry is not None else None
    return v3.client_env(env) if v3 is not None else env


def resource_result(res: t.Any, *, check_mode: bool, seen: t.Optional[t.Any] = None) -> t.Dict[str, t.Any]:
    """The resource after the run: its daemon, its limits, whether it answers (``healthy_now``: counts as unhealthy).

    ``seen``: the run's observation of it, still true when the run changed nothing; None reads the daemon's state again.
    """
    paths = res.setup.paths
    state = seen.liveness if seen is not None else inspect(paths)
    healthy = False
    reason = ''
    daemon = res.daemon
    stop = getattr(res, 'stop', None)
    running = state.running
    if check_mode:
        # as planned: a daemon the plan starts (or keeps) runs and answers afterwards
        healthy = running = state.running or bool(daemon and daemon.changed)
    elif state.running:
        try:
            if not res.setup.daemon.answered:
                res.setup.daemon.ping()
            healthy = True
        except MpsError as exc:
            reason = exc.msg
    else:
        reason = 'not running'
    limits = res.limits
    seen = getattr(res, 'first_limits', None) or limits
    parts = [part for part in (limits, stop, daemon) if part is not None]
    before = dict(stop.before if stop is not None else (daemon.before if daemon else {}))
    return {
        'name': res.name,
        'pid': state.pid if state.running else (daemon.pid if daemon else None),
        'running': running,
        'healthy': healthy,
        'healthy_now': healthy or check_mode,
        'reason': reason or ('' if healthy else 'not running'),
        'devices': [dict(gpu.summary(), ordinal=ordinal) for ordinal, gpu in enumerate(res.entry.devices)] if res.entry else [],
        'multiuser': res.entry.multiuser if res.entry else False,
        'replicas': res.entry.replicas if res.entry else None,
        'env': client_env(res),
        'protocol': '3' if res.entry is not None and res.entry.v3 is not None else 'legacy',
        'v3': res.entry.v3.as_dict(paths.pipe_dir) if res.entry is not None and res.entry.v3 is not None else None,
        'container': res.setup.container,
        'limits': {'persisted': planned_resource(res)['limits']['persisted'], 'commands': limits.commands if limits else [],
                   'pending': limits.pending if limits else []},
        'restarted': res.restart,
        'changed': any(part.changed for part in parts),
        'actions': [action for part in parts for action in part.actions],
        'started_at': daemon.started_at if daemon else None,
        'notes': list(daemon.notes) if daemon else [],
        'gone': (list(stop.gone) if stop is not None else []) + [
            item for item in (daemon.gone if daemon else []) if stop is None or item not in stop.gone],
        'diff': {'before': dict(before, limits=seen.before if seen else None),
                 'after': dict(daemon.after if daemon else {}, limits=limits.after if limits else None)},
    }
