# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Attribution of a process to a container or Slurm job from its cgroup (issue 44), held to real ``/proc/<pid>/cgroup``
files: each fixture in fixtures/cgroups.json is one a public repository's tests, docs or issues show, cited by
repository, path and commit (or issue), never one written for this test."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.mps.plugins.module_utils._attribution import (
    OWNER_KINDS, attribute, cgroup_paths, owner_counts, owner_kind, parse_cgroup,
)

with open(os.path.join(os.path.dirname(__file__), 'fixtures', 'cgroups.json'), encoding='utf-8') as handle:
    EXAMPLES = json.load(handle)


def test_the_fixtures_cover_every_layout_and_cite_a_source():
    layouts = collections.Counter(example['layout'] for example in EXAMPLES)
    for layout in ('docker_v1_cgroupfs', 'docker_v2_systemd', 'podman', 'containerd_k8s_cgroupfs', 'containerd_k8s_systemd',
                   'crio_k8s_systemd', 'slurm_v1', 'slurm_v2', 'host_v2', 'container_private_cgroupns'):
        assert layouts[layout] >= 1, layout
    assert len(EXAMPLES) >= 40
    for example in EXAMPLES:
        assert example['source'].startswith(('https://', 'http://')) or '/' in example['source'], example
    owners = collections.Counter(example['expected']['owner'] for example in EXAMPLES)
    assert set(owners) == set(OWNER_KINDS)  # every kind is met by a real file


@pytest.mark.parametrize('example', EXAMPLES, ids=['%d-%s' % (n, e['layout']) for n, e in enumerate(EXAMPLES)])
def test_a_real_cgroup_file_is_attributed_as_its_engine_placed_it(example):
    found = parse_cgroup(example['content'])
    got = {'owner': owner_kind(example['content'], found), 'engine': found['engine'], 'container': found['container'],
           'job': found['job']}
    assert got == example['expected'], (example['source'], example['note'])


def test_lines_split_on_their_first_two_colons_only():
    line = '11:pids:/system.slice/containerd.service/kubepods-besteffort-pod2105e389.slice:cri-containerd:' + 'a' * 64
    assert cgroup_paths(line) == ['/system.slice/containerd.service/kubepods-besteffort-pod2105e389.slice:cri-containerd:' + 'a' * 64]
    assert parse_cgroup(line)['engine'] == 'containerd'


def test_monitors_are_not_their_containers():
    conmon = '0::/machine.slice/libpod-conmon-%s.scope' % ('b' * 64)
    assert parse_cgroup(conmon)['container'] is None and owner_kind(conmon, parse_cgroup(conmon)) == 'unknown'


def test_an_unreadable_cgroup_is_unknown_and_counts_are_bounded():
    assert owner_kind('', parse_cgroup('')) == 'unknown'
    counts = owner_counts([{'owner': 'container'}, {'owner': 'container'}, {'owner': 'slurm_job'}, {}])
    assert counts == {'container': 2, 'slurm_job': 1, 'host': 0, 'unknown': 1}


def test_a_live_process_claims_its_job_and_is_read_from_proc(tmp_path):
    proc = subprocess.Popen([sys.executable, '-c', 'import sys; print(1, flush=True); sys.stdin.read()'],  # pylint: disable=consider-using-with
                            env=dict(os.environ, SLURM_JOB_ID='4242'), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b'1\n'
        found = attribute(proc.pid, uid=os.getuid())
        assert found['pid'] == proc.pid and found['claimed_job'] == '4242' and found['uid'] == os.getuid()
        assert found['owner'] in OWNER_KINDS and found['job'] is None  # a claim is not a cgroup's job
    finally:
        proc.stdin.close()
        proc.wait(10)
    gone = attribute(proc.pid)
    assert gone['owner'] == 'unknown' and gone['claimed_job'] is None
