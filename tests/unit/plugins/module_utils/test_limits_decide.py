# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The limits decision as tables: (wanted, observed) -> commands, with no process and no file; and the property that
deciding again on what the daemon reports after the commands yields no command."""
from __future__ import annotations

import random

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._limits.decide import (
    LimitsSeen,
    ServerLimits,
    decide_limits,
)
from ansible_collections.gpufleet.mps.plugins.module_utils._limits.model import Limits

U0, U1 = 'GPU-00000000-0000-0000-0000-000000000000', 'GPU-11111111-1111-1111-1111-111111111111'


def _limits(pct=None, **mem):
    return Limits(pct, {{'u0': U0, 'u1': U1}[key]: mib for key, mib in mem.items()})


# (id, wanted, observed, exact, running_servers) -> (commands, pending pids, restart?, warnings?)
TABLE = [
    ('not running: nothing is sent, the start replays', _limits(25, u0=10240), LimitsSeen(_limits(50)), True, 'ignore',
     [], [], False, False),
    ('10240M reads back as 10G: no change', _limits(25, u0=10240, u1=10240),
     LimitsSeen(_limits(25, u0=10240, u1=10240), True, 25.0, {0: '10G', 1: '10G'}), True, 'ignore', [], [], False, False),
    ('a new percentage', _limits(25), LimitsSeen(None, True, 100.0, {0: '', 1: ''}), True, 'ignore',
     ['set_default_active_thread_percentage 25.0'], [], False, False),
    ('unset limit (r580 prints nothing) is set', _limits(None, u0=2048), LimitsSeen(None, True, 100.0, {0: '', 1: ''}), False,
     'ignore', ['set_default_device_pinned_mem_limit 0 2048M'], [], False, False),
    ('the lossy read-back matches but the persisted value differs: sent again', _limits(None, u0=3500),
     LimitsSeen(_limits(None, u0=3840), True, 100.0, {0: '3G', 1: ''}), False, 'ignore',
     ['set_default_device_pinned_mem_limit 0 3500M'], [], False, False),
    ('a daemon restarted without replay is set again', _limits(50, u0=4096),
     LimitsSeen(_limits(50, u0=4096), True, 100.0, {0: '', 1: ''}), True, 'ignore',
     ['set_default_device_pinned_mem_limit 0 4096M', 'set_default_active_thread_percentage 50.0'], [], False, False),
    ('exact: a pinned limit no longer wanted is a restart, the percentage back to 100', _limits(),
     LimitsSeen(_limits(25, u0=2048), True, 25.0, {0: '2G', 1: ''}), True, 'ignore',
     ['set_default_active_thread_percentage 100.0'], [], True, False),
    ('not exact: what is not given is not managed', _limits(None, u1=1024),
     LimitsSeen(_limits(25, u0=2048, u1=1024), True, 25.0, {0: '2G', 1: '1G'}), False, 'ignore', [], [], False, False),
    ('a read-back that is no size warns and is set again', _limits(None, u0=1024),
     LimitsSeen(_limits(None, u0=1024), True, 100.0, {0: 'N/A', 1: ''}), False, 'ignore',
     ['set_default_device_pinned_mem_limit 0 1024M'], [], False, True),
    ('a running server with other limits: pending under ignore', _limits(25),
     LimitsSeen(_limits(25), True, 25.0, {0: '', 1: ''}, (ServerLimits(7, 100.0, {0: None, 1: None}),)), True, 'ignore',
     [], [7], False, False),
    ('a running server with other limits: its own commands under update', _limits(25, u0=1024),
     LimitsSeen(_limits(25, u0=1024), True, 25.0, {0: '1G', 1: ''},
                (ServerLimits(7, 100.0, {0: None, 1: None}), ServerLimits(8, 25.0, {0: '1G', 1: None}))),
     True, 'update', ['set_device_pinned_mem_limit 7 0 1024M', 'set_active_thread_percentage 7 25.0'], [], False, False),
    # client priority (issue 29): get_default_client_priority read in the same batch
    ('a client priority is set when the daemon has another', Limits(None, {}, None, 1),
     LimitsSeen(None, True, 100.0, {0: '', 1: ''}, (), 0), True, 'ignore',
     ['set_default_client_priority 1'], [], False, False),
    ('the same client priority: nothing sent', Limits(None, {}, None, 1),
     LimitsSeen(Limits(None, {}, None, 1), True, 100.0, {0: '', 1: ''}, (), 1), True, 'ignore', [], [], False, False),
    ('exact: a priority no longer given goes back to normal', Limits(),
     LimitsSeen(Limits(None, {}, None, 1), True, 100.0, {0: '', 1: ''}, (), 1), True, 'ignore',
     ['set_default_client_priority 0'], [], False, False),
    ('not exact: a priority not given is not managed', Limits(50.0),
     LimitsSeen(Limits(50.0, {}, None, 1), True, 50.0, {0: '', 1: ''}, (), 1), False, 'ignore', [], [], False, False),
    ('a running server keeps its priority: a warning, nothing pending', Limits(None, {}, None, 1),
     LimitsSeen(None, True, 100.0, {0: '', 1: ''}, (ServerLimits(7, 100.0, {0: None, 1: None}),), 0), True, 'ignore',
     ['set_default_client_priority 1'], [], False, True),
    ('a binary without client priority (None read) and none wanted: nothing sent', Limits(),
     LimitsSeen(None, True, 100.0, {0: '', 1: ''}, (), None, 'Unrecognized command'), True, 'ignore', [], [], False, False),
]


@pytest.mark.parametrize('wanted, seen, exact, running_servers, commands, pending, restart, warns',
                         [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_decide_limits_table(wanted, seen, exact, running_servers, commands, pending, restart, warns):
    decision = decide_limits(wanted, [U0, U1], seen, exact=exact, running_servers=running_servers, name='train')
    assert decision.commands == commands
    assert [server.pid for server in decision.pending] == pending
    assert bool(decision.restart_reasons) == restart
    assert bool(decision.warnings) == warns


def test_the_diff_shows_values_as_the_daemon_reports_them():
    seen = LimitsSeen(_limits(30, u0=10240), True, 30.0, {0: '10G', 1: ''})
    decision = decide_limits(_limits(30, u0=10240), [U0, U1], seen, exact=True, running_servers='ignore', name='train')
    assert decision.before == decision.after == {'active_thread_percentage': 30.0,
                                                 'pinned_device_mem_limit': {'0': '10G', '1': None}}


# --- property: the daemon told the commands reports what makes the next decision empty --------------------------
def _readback(mib):
    """How the daemon prints a pinned limit it was given (r580, gpu-evidence 2026-12-04: 3840M -> 3G, 1044M -> 1G)."""
    return '%dG' % (mib // 1024) if mib >= 1024 else '%dM' % mib


def _after(seen, commands, uuids):
    """What a daemon that accepted ``commands`` reports next (a simple model of the real one's read-back)."""
    pct, mem = seen.percentage, dict(seen.mem)
    servers = {server.pid: ServerLimits(server.pid, server.active_thread_percentage, dict(server.pinned_device_mem_limit))
               for server in seen.servers}
    for cmd in commands:
        words = cmd.split()
        if words[0] == 'set_default_active_thread_percentage':
            pct = float(words[1])
        elif words[0] == 'set_default_device_pinned_mem_limit':
            mem[int(words[1])] = _readback(int(words[2][:-1]))
        elif words[0] == 'set_active_thread_percentage':
            old = servers[int(words[1])]
            servers[old.pid] = ServerLimits(old.pid, float(words[2]), old.pinned_device_mem_limit)
        elif words[0] == 'set_device_pinned_mem_limit':
            old = servers[int(words[1])]
            servers[old.pid] = ServerLimits(old.pid, old.active_thread_percentage,
                                            {**old.pinned_device_mem_limit, int(words[2]): _readback(int(words[3][:-1]))})
        else:  # pragma: no cover - a command the model does not know is a test failure
            raise AssertionError(cmd)
    assert len(mem) == len(uuids)
    return pct, mem, tuple(servers.values())


@pytest.mark.parametrize('seed', range(200))
def test_deciding_again_after_the_commands_yields_no_command(seed):
    rng = random.Random(seed)
    uuids = [U0, U1][:rng.randint(1, 2)]

    def some_limits():
        pct = rng.choice([None, 10.0, 25.0, 33.3, 50.0, 100.0])
        return Limits(pct, {uuid: rng.choice([512, 1024, 1044, 3840, 10240, 20480]) for uuid in uuids if rng.random() < 0.6})

    wanted, persisted = some_limits(), rng.choice([None, some_limits()])
    exact, running_servers = rng.choice([True, False]), rng.choice(['ignore', 'update'])
    seen = LimitsSeen(persisted, True, rng.choice([None, 100.0, 25.0]),
                      {o: rng.choice(['', '2G', '512M']) for o in range(len(uuids))},
                      tuple(ServerLimits(pid, rng.choice([None, 100.0, 25.0]), {o: rng.choice([None, '1G']) for o in range(len(uuids))})
                            for pid in range(rng.randint(0, 2))))
    first = decide_limits(wanted, uuids, seen, exact=exact, running_servers=running_servers, name='train')
    pct, mem, servers = _after(seen, first.commands, uuids)
    # The run persists ``wanted`` as it applies it; the next run observes that and the daemon's new answers.
    again = decide_limits(wanted, uuids, LimitsSeen(wanted, True, pct, mem, servers), exact=exact, running_servers=running_servers, name='train')
    assert again.commands == [], (seed, first.commands)
    assert [server.pid for server in again.pending] == [server.pid for server in first.pending]
    assert again.restart_reasons == [] or not exact or any(wanted.mem_for(uuid) is None for uuid in uuids)


def test_the_priority_appears_in_before_and_after_only_where_managed():
    seen = LimitsSeen(Limits(None, {}, None, 1), True, 100.0, {0: '', 1: ''}, (), 1)
    decision = decide_limits(Limits(), [U0, U1], seen, exact=True, running_servers='ignore', name='train')
    assert decision.before['client_priority'] == 'below_normal' and decision.after['client_priority'] == 'normal'
    plain = decide_limits(Limits(25.0), [U0, U1], LimitsSeen(None, True, 25.0, {0: '', 1: ''}, (), 0), exact=True, running_servers='ignore', name='train')
    assert 'client_priority' not in plain.before and 'client_priority' not in plain.after
