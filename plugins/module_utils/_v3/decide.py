# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What brings a running v3 daemon's namespaces to the wanted ones, live, decided from what it listed. No I/O.

A limit can be set but never unset with ``namespace set`` / ``server set`` [ref 1.3, 1.4]: a named namespace that has a
limit no longer wanted is deleted and made again; the ``default`` namespace cannot be deleted, so its unset limit is a
restart's. ``namespace set`` and ``server set`` fail while the namespace has a client attached [ref 1.4, O], and a
delete ends the namespace's clients: each change names the clients it would touch, for ``busy`` to decide.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from .readout import V3Readout
from .spec import DEFAULT_NAMESPACE, NamespaceLimits, V3Spec

# The list prints a percentage with two decimals [ref 1.4]
_PCT_TOLERANCE = 0.006


@dataclass(frozen=True)
class LiveChange:
    """One live change of a namespace: ``verb`` is ``create``, ``set``, ``recreate`` (delete, create, set) or ``delete``;
    ``attached`` the clients the namespace has now."""

    verb: str
    namespace: str
    limits: NamespaceLimits
    attached: t.Tuple[int, ...] = ()
    was: t.Optional[NamespaceLimits] = None

    def commands(self, server: str, *, force: bool) -> t.List[t.List[str]]:
        """The argv commands, in order (``force``: a delete ends attached clients)."""
        where = '--server=%s' % server
        if self.namespace == DEFAULT_NAMESPACE:
            return [['server', 'set', server] + self.limits.flags()]
        delete = ['namespace', 'delete', self.namespace, where] + (['--force'] if force else [])
        make = [['namespace', 'create', self.namespace, where]]
        if not self.limits.empty:
            make.append(['namespace', 'set', self.namespace, where] + self.limits.flags())
        if self.verb == 'delete':
            return [delete]
        if self.verb == 'set':
            return make[1:]
        return ([delete] if self.verb == 'recreate' else []) + make

    @property
    def touches_clients(self) -> bool:
        return bool(self.attached) and self.verb != 'create'

    def describe(self, server: str) -> str:
        if self.verb == 'delete':
            return 'delete namespace %s of server %s' % (self.namespace, server)
        what = 'server %s (its default namespace)' % server if self.namespace == DEFAULT_NAMESPACE else \
            'namespace %s of server %s' % (self.namespace, server)
        was = ' (was %s)' % self.was.describe() if self.was is not None else ''
        verb = {'create': 'create', 'set': 'set', 'recreate': 'make anew (a limit is dropped)'}[self.verb]
        return '%s %s: %s%s' % (verb, what, self.limits.describe(), was)


def _same(want: t.Optional[float], have: t.Optional[float]) -> bool:
    if want is None or have is None:
        return want is have
    return abs(float(want) - float(have)) < _PCT_TOLERANCE


def _plain(limits: NamespaceLimits) -> NamespaceLimits:
    """What the limits mean: a thread percentage of 100, a pinned limit of 0 and priority 0 (normal) are no limit - how an
    unset one is printed is not documented [U], so either form reads the same."""
    pct = limits.active_thread_percentage
    return NamespaceLimits(None if pct is not None and abs(pct - 100.0) < _PCT_TOLERANCE else pct, limits.pinned_mib or None,
                           limits.client_priority or None)


def compare(want: NamespaceLimits, have: NamespaceLimits, *, unreadable: bool = False) -> str:
    """'' (as wanted), ``set`` (each limit it has is wanted: set the wanted ones) or ``unset`` (it has a limit no longer
    wanted). Limits the list printed in a form not understood are set again (``set``; nothing where none is wanted):
    never a restart or a namespace made anew for a form of printing."""
    want, have = _plain(want), _plain(have)
    if unreadable:
        return 'set' if not want.empty else ''
    equal = (_same(want.active_thread_percentage, have.active_thread_percentage) and want.pinned_mib == have.pinned_mib
             and want.client_priority == have.client_priority)
    if equal:
        return ''
    dropped = ((have.active_thread_percentage is not None and want.active_thread_percentage is None)
               or (have.pinned_mib is not None and want.pinned_mib is None)
               or (have.client_priority is not None and want.client_priority is None))
    return 'unset' if dropped else 'set'


def live_changes(spec: V3Spec, seen: V3Readout) -> t.Tuple[t.List[LiveChange], str]:
    """(the live changes, in order: the default namespace, the wanted ones, the deletes), or a restart's reason."""
    if not seen.found:
        return [], ('its server %s is not in the daemon\'s lists (it exited - a GPU the host lacks? - or its -a file was '
                    'refused)' % spec.server)
    changes: t.List[LiveChange] = []
    have = seen.namespaces.get(DEFAULT_NAMESPACE, NamespaceLimits())
    how = compare(spec.default, have, unreadable=DEFAULT_NAMESPACE in seen.unreadable)
    if how == 'unset':
        return [], ('the default namespace of server %s has %s, and %s is wanted: a limit is only dropped by a new start' % (
            spec.server, have.describe(), spec.default.describe()))
    if how == 'set':
        changes.append(LiveChange('set', DEFAULT_NAMESPACE, spec.default, tuple(seen.attached(DEFAULT_NAMESPACE)), have))
    for name, limits in spec.namespaces:
        if name not in seen.namespaces:
            changes.append(LiveChange('create', name, limits))
            continue
        how = compare(limits, seen.namespaces[name], unreadable=name in seen.unreadable)
        if how:
            changes.append(LiveChange('set' if how == 'set' else 'recreate', name, limits, tuple(seen.attached(name)),
                                      seen.namespaces[name]))
    wanted = dict(spec.namespaces)
    for name in seen.namespaces:
        if name != DEFAULT_NAMESPACE and name not in wanted:
            changes.append(LiveChange('delete', name, NamespaceLimits(), tuple(seen.attached(name)), seen.namespaces[name]))
    return changes, ''
