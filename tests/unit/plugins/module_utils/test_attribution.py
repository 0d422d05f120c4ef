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


# Layouts composed from the real ones above (each part cited there), for what the fixtures do not show whole.
NESTED = [
    # docker in docker under systemd: the inner container's, not the outer one's
    ('0::/system.slice/docker-%s.scope/docker/%s' % ('1' * 64, '2' * 64), 'docker', '2' * 64),
    # kind on docker (cgroupfs): the pod's container, not the node container
    ('12:pids:/docker/%s/kubelet/kubepods/burstable/pod0e886e9a-3879-45f9-b44d-86ef9df03224/%s' % ('3' * 64, '4' * 64),
     'kubernetes', '4' * 64),
    # kind on podman: containerd's container inside the node
    ('0::/machine.slice/libpod-%s.scope/kubelet.slice/kubelet-kubepods.slice/cri-containerd-%s.scope' % ('5' * 64, '6' * 64),
     'containerd', '6' * 64),
    # CRI-O with its cgroupfs manager: no .scope
    ('0::/kubepods/besteffort/pod1fe19bf5-e8ef-11e8-900c-52daee5a874d/crio-%s' % ('7' * 64), 'crio', '7' * 64),
]


@pytest.mark.parametrize('text, engine, container', NESTED)
def test_the_innermost_container_is_the_clients(text, engine, container):
    found = parse_cgroup(text)
    assert (found['engine'], found['container']) == (engine, container)


def test_slurm_with_several_slurmd_per_host_and_unknown_engines_under_system_slice():
    assert parse_cgroup('4:freezer:/slurm_node7/uid_1000/job_31/step_0')['job'] == '31'
    nerdctl = '0::/system.slice/nerdctl-%s.scope' % ('8' * 64)
    assert owner_kind(nerdctl, parse_cgroup(nerdctl)) == 'unknown'  # an engine not known here: never the host
