# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The schedulers guide's play and templates, taken from the page as shown, rendered as Ansible's template module
would (trim_blocks). (That teardown removes exactly what the role wrote is the mps_host integration target's.)"""
from __future__ import annotations

import textwrap
from pathlib import Path

import jinja2
import yaml

COLLECTION = Path(__file__).resolve().parents[3]
GUIDE = COLLECTION / 'docs' / 'docsite' / 'rst' / 'guide_schedulers.rst'


def _block(marker):
    """The lines between the marker's begin and end lines (as the fleet_facts integration target takes them)."""
    lines = GUIDE.read_text(encoding='utf-8').splitlines()
    begins = [number for number, line in enumerate(lines) if marker + ' - begin' in line]
    ends = [number for number, line in enumerate(lines) if marker + ' - end' in line]
    assert len(begins) == 1 and len(ends) == 1 and begins[0] < ends[0], 'one %r block in %s' % (marker, GUIDE.name)
    return textwrap.dedent('\n'.join(lines[begins[0] + 1:ends[0]])) + '\n'


def _render(marker, facts):
    environment = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return environment.from_string(_block(marker)).render(ansible_local={'gpufleet_mps': facts})


def _gpu(index):
    return {'index': index, 'uuid': 'GPU-%d' % index, 'name': 'NVIDIA H100 80GB HBM3', 'memory_total_mib': 81559}


def _resource(name, indices, replicas=None):
    return {'name': name, 'devices': [_gpu(index) for index in indices], 'replicas': replicas, 'multiuser': False,
            'healthy': True, 'active_thread_percentage': None, 'pinned_device_mem_limit_mib': {},
            'env': {'CUDA_MPS_PIPE_DIRECTORY': '/run/nvidia/mps/%s/pipe' % name}}


def _facts(*resources, ready=True):
    return {'format': 1, 'root': '/run/nvidia/mps', 'ready': ready, 'resources': list(resources)}


def _settings(text):
    return [line for line in text.splitlines() if line and not line.startswith('#')]


def test_gres_conf_has_a_gpu_and_an_mps_line_per_gpu_in_index_order_whatever_the_resource_names():
    text = _render('gres.conf', _facts(_resource('train', [0]), _resource('example.com/infer', [3, 1], replicas=4)))
    assert _settings(text) == ['Name=gpu File=/dev/nvidia0', 'Name=mps Count=100 File=/dev/nvidia0',
                               'Name=gpu File=/dev/nvidia1', 'Name=mps Count=100 File=/dev/nvidia1',
                               'Name=gpu File=/dev/nvidia3', 'Name=mps Count=100 File=/dev/nvidia3']
    assert '# slurm.conf: GresTypes=gpu,mps and for this node Gres=gpu:3,mps:300\n' in text
    assert '# example.com/infer spans 2 GPUs: a job needs CUDA_VISIBLE_DEVICES as this daemon numbers them.\n' in text
    assert 'train spans' not in text and '\n\n' not in text and '{' not in text


def test_gres_conf_of_a_host_without_resources_has_no_settings():
    text = _render('gres.conf', _facts(ready=False))
    assert _settings(text) == [] and 'Gres=gpu:0,mps:0' in text


def test_the_guide_shows_what_its_template_renders():
    text = _render('gres.conf', _facts(_resource('train', [0]), _resource('example.com/infer', [1, 3], replicas=4)))
    shown = GUIDE.read_text(encoding='utf-8')
    assert textwrap.indent(text, '   ') in shown


def test_node_labels_name_nested_resources_with_a_dot_and_replicas_only_where_given():
    text = _render('node labels', _facts(_resource('train', [0]), _resource('example.com/infer', [1, 3], replicas=4)))
    assert text.splitlines() == ['gpufleet.mps/ready=true', 'gpufleet.mps/example.com.infer.gpus=2',
                                 'gpufleet.mps/example.com.infer.replicas=4', 'gpufleet.mps/train.gpus=1']
    assert textwrap.indent(text, '   ') in GUIDE.read_text(encoding='utf-8')
    for line in text.splitlines():
        name = line.split('=', 1)[0].split('/', 1)[1]
        assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()


def test_node_labels_of_a_host_without_resources_say_it_is_not_ready():
    assert _render('node labels', _facts(ready=False)).splitlines() == ['gpufleet.mps/ready=false']


def test_the_guides_play_reads_the_facts_where_the_role_wrote_them_and_renders_the_template():
    play, = yaml.safe_load(_block('schedulers play'))
    setup, template = play['tasks']
    assert setup['ansible.builtin.setup']['fact_path'] == "{{ mps_local_facts_dir | default('/etc/ansible/facts.d') }}"
    assert template['ansible.builtin.template']['src'] == 'gres.conf.j2'
    assert template['when'] == 'ansible_local.gpufleet_mps is defined'
